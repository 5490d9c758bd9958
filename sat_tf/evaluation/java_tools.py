"""The Java programs of coco-caption, run under a deadline: the PTB tokenizer, METEOR 1.5
and SPICE, which ship inside `pycocoevalcap`.

They run here with the commands and line protocols of the `pycocoevalcap` wrappers, but
with their failures caught: a missing `java`, a missing jar, a crash or a timeout raises
`Unavailable` with the reason, never another exception or a hang; a missing `java` is
named with the Debian package that provides it (`java_missing`). Without Java the
captions are tokenized by `simple_ptb_tokenize`, a Python version of the PTB rules.
"""

import atexit
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping

import numpy as np
from pycocoevalcap.meteor import meteor as _meteor_module
from pycocoevalcap.spice import spice as _spice_module
from pycocoevalcap.tokenizer import ptbtokenizer as _ptb_module

DEFAULT_JAVA_TIMEOUT = 1800.0
# The command that installs `java` on Debian and Ubuntu (what .ci/run installs).
JAVA_INSTALL = "apt-get install default-jre-headless"

_PUNCTUATIONS = frozenset(_ptb_module.PUNCTUATIONS)
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr vs etc mt ft inc ltd co corp prof gen sgt capt lt col rev".split()
)
_BRACKETS = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-"}
_CLITIC = re.compile(r"^(.*[a-z0-9])('s|'re|'ve|'ll|'d|'m)$")


class Unavailable(Exception):
    """A Java scorer could not run; the message says why."""


def simple_ptb_tokenize(caption: str) -> str:
    """Pure-Python stand-in for coco-caption's PTB tokenization, used without Java.

    coco-caption runs the Stanford PTBTokenizer (CoreNLP 3.4.1, `-preserveLines
    -lowerCase`) and then drops the tokens in `PTBTokenizer.PUNCTUATIONS`. This function
    reproduces the result on ordinary captions: it lowercases, splits off `. , ; : ? !`
    (keeping runs such as `?!` together, which coco-caption then keeps), `...`, `--`,
    `%`, `$`, `#`, quotes and brackets (written `-lrb-` etc. and, as in coco-caption,
    kept, because its punctuation list has them in upper case), splits clitics as PTB
    does (`dog's` -> `dog 's`, `isn't` -> `is n't`, `cannot` -> `can not`), keeps
    numbers such as `1,000`, `3.5`, `10:30` and words such as `black-and-white`, `u.s.`,
    `st.` whole, and drops the same punctuation tokens. It may differ from the Java
    tokenizer on rare constructions (unusual abbreviations, `y'all`, `'90s`).

    Args:
      caption: one caption.

    Returns:
      The space-separated tokens.
    """
    text = re.sub(r"\s+", " ", caption.lower())
    for bracket, token in _BRACKETS.items():
        text = text.replace(bracket, f" {token} ")
    text = re.sub(r"\"|``|''", " ", text)
    text = re.sub(r"\.\.\.+", " ... ", text)
    text = re.sub(r"--+", " -- ", text)
    text = re.sub(r"[?!]+", r" \g<0> ", text)
    text = re.sub(r"[;%$#`]", r" \g<0> ", text)
    text = re.sub(r"(?<!\d)[,:]|[,:](?!\d)", r" \g<0> ", text)
    text = re.sub(r"\bcannot\b", "can not", text)
    tokens = []
    for word in text.split():
        tokens.extend(_split_word(word))
    return " ".join(t for t in tokens if t not in _PUNCTUATIONS)


def _split_word(word: str) -> list[str]:
    """Splits quotes, edge hyphens, a final period and clitics off one word."""
    if word in ("...", "--") or word in _BRACKETS.values():
        return [word]
    head, tail = [], []
    while word[:1] in ("'", "-") and len(word) > 1 and word != "'s":
        head.append(word[0])
        word = word[1:]
    while word[-1:] in ("-", ".") and len(word) > 1:
        core = word[:-1]
        if word[-1] == "." and ("." in core or core in _ABBREVIATIONS):
            break
        tail.insert(0, word[-1])
        word = core
    if word.endswith("'") and len(word) > 1:
        tail.insert(0, "'")
        word = word[:-1]
    if word.endswith("n't") and len(word) > 3:
        return [*head, word[:-3], "n't", *tail]
    match = _CLITIC.match(word)
    if match:
        return [*head, match.group(1), match.group(2), *tail]
    return [*head, word, *tail]


def find_java() -> str | None:
    return shutil.which("java")


def java_missing(program: str) -> str:
    """Why `program` cannot run without `java` on PATH, and how to install it."""
    return f"java not found on PATH; {program} is a Java program (install it: {JAVA_INSTALL})"


def _tail(data: bytes, limit: int = 400) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return text[-limit:] if text else "(no output on stderr)"


def java_ptb_tokenize(java: str, sentences: list[str], timeout: float) -> list[str]:
    """Runs coco-caption's PTBTokenizer command on `sentences`, one per line."""
    jar_dir = os.path.dirname(os.path.abspath(_ptb_module.__file__))
    jar = os.path.join(jar_dir, _ptb_module.STANFORD_CORENLP_3_4_1_JAR)
    if not os.path.isfile(jar):
        raise Unavailable(f"the PTB tokenizer jar {jar} is missing")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "captions.txt")
        with open(path, "w", encoding="utf-8", errors="replace") as f:
            f.write("".join(re.sub(r"\s", " ", s) + "\n" for s in sentences))
        cmd = [java, "-cp", jar, "edu.stanford.nlp.process.PTBTokenizer"]
        cmd += ["-preserveLines", "-lowerCase", path]
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as e:
            raise Unavailable(f"the PTB tokenizer did not finish within {timeout:g} s") from e
        except OSError as e:
            raise Unavailable(f"could not start java for the PTB tokenizer: {e}") from e
    if proc.returncode != 0:
        raise Unavailable(
            f"the PTB tokenizer exited with code {proc.returncode}: {_tail(proc.stderr)}"
        )
    lines = proc.stdout.decode("utf-8", errors="replace").split("\n")
    if len(lines) < len(sentences):
        raise Unavailable(
            f"the PTB tokenizer returned {len(lines)} lines for {len(sentences)} captions"
        )
    return [
        " ".join(w for w in line.rstrip().split(" ") if w not in _PUNCTUATIONS)
        for line in lines[: len(sentences)]
    ]


def tokenize(
    references: dict[str, list[str]], hypotheses: Mapping[str, str], timeout: float
) -> tuple[dict[str, list[str]], dict[str, list[str]], str]:
    """PTB-tokenizes references and hypotheses in one Java call, else in Python.

    Returns:
      (gts, res, tokenizer): the scorers' inputs, {id: [refs]} and {id: [hyp]}, and a
      description of the tokenizer that ran.
    """
    ids = list(hypotheses)
    sentences = [hypotheses[i] for i in ids]
    for i in ids:
        sentences.extend(references[i])
    java = find_java()
    tokenizer = "PTBTokenizer (Stanford CoreNLP 3.4.1, java)"
    try:
        if java is None:
            raise Unavailable(java_missing("the PTB tokenizer"))
        tokens = java_ptb_tokenize(java, sentences, timeout)
    except Unavailable as e:
        tokens = [simple_ptb_tokenize(s) for s in sentences]
        tokenizer = f"sat_tf.evaluation.java_tools.simple_ptb_tokenize (Python), because {e}"
    res = {i: [tokens[k]] for k, i in enumerate(ids)}
    gts, k = {}, len(ids)
    for i in ids:
        gts[i] = tokens[k : k + len(references[i])]
        k += len(references[i])
    return gts, res, tokenizer


def _clean_meteor(text: str) -> str:
    return text.replace("|||", "").replace("  ", " ")


# METEOR's JVM takes seconds to start and load its paraphrase table (1.1 GB resident),
# while scoring a split takes a fraction of a second: one process answers the calls that
# come within this many seconds of each other (evaluations in a row, a test session) and
# is closed after that, so a training run does not hold it between its epochs.
METEOR_IDLE_SECONDS = 60.0

_meteor_lock = threading.Lock()
_meteor = None  # the running _MeteorProcess, if any


class _MeteorProcess:
    """A METEOR 1.5 `-stdio` process, its stderr file and its idle timer."""

    def __init__(self, key: tuple[str, str, str]):
        java, jar_dir, jar = key
        self.key = key
        self.stderr = tempfile.TemporaryFile()
        cmd = [java, "-jar", "-Xmx2G", jar, "-", "-", "-stdio", "-l", "en", "-norm"]
        try:
            self.proc = subprocess.Popen(
                cmd, cwd=jar_dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr
            )
        except OSError as e:
            self.stderr.close()
            raise Unavailable(f"could not start java for METEOR: {e}") from e
        self.idle_timer = None

    def ask(self, line: str, answers: int = 1) -> list[str]:
        self.proc.stdin.write((line + "\n").encode("utf-8"))
        self.proc.stdin.flush()
        out = [self.proc.stdout.readline().decode("utf-8").strip() for _ in range(answers)]
        if not all(out):
            raise Unavailable("METEOR stopped answering")
        return out

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        return _tail(self.stderr.read())

    def close(self):
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.stderr):
            try:
                stream.close()
            except OSError:  # stdin's buffer, flushed into a pipe nobody reads
                pass


def _close_meteor(only=None):
    """Stop the kept METEOR process (only if it is `only`, when given)."""
    global _meteor
    with _meteor_lock:
        if _meteor is not None and (only is None or _meteor is only):
            _meteor.close()
            _meteor = None


atexit.register(_close_meteor)


def meteor(java: str, gts: dict, res: dict, timeout: float) -> float:
    """METEOR 1.5 through coco-caption's jar and `-stdio` protocol, with a deadline.

    As `pycocoevalcap.meteor.Meteor`: one `SCORE ||| refs ||| hyp` line per image, whose
    answers form the `EVAL` line; the last answer is the corpus score. The process is kept
    for the next call for METEOR_IDLE_SECONDS (each `EVAL` line scores only its own
    statistics). A watchdog kills Java at the deadline, so a dead or stuck process ends in
    `Unavailable`, not a hang; a failed process is not used again.
    """
    global _meteor
    jar_dir = os.path.dirname(os.path.abspath(_meteor_module.__file__))
    jar = _meteor_module.METEOR_JAR
    if not os.path.isfile(os.path.join(jar_dir, jar)):
        raise Unavailable(f"the METEOR jar {jar} is missing in {jar_dir}")
    with _meteor_lock:
        if _meteor is not None and (
            _meteor.key != (java, jar_dir, jar) or _meteor.proc.poll() is not None
        ):
            _meteor.close()
            _meteor = None
        if _meteor is None:
            _meteor = _MeteorProcess((java, jar_dir, jar))
        process = _meteor
        if process.idle_timer is not None:
            process.idle_timer.cancel()
        timed_out = threading.Event()

        def kill():
            timed_out.set()
            process.proc.kill()

        watchdog = threading.Timer(timeout, kill)
        watchdog.daemon = True
        watchdog.start()
        try:
            stats = []
            for image_id, hyp in res.items():
                refs = " ||| ".join(_clean_meteor(r) for r in gts[image_id])
                stats += process.ask(f"SCORE ||| {refs} ||| {_clean_meteor(hyp[0])}")
            answers = process.ask("EVAL ||| " + " ||| ".join(stats), len(stats) + 1)
            score = float(answers[-1])
        except (OSError, ValueError, Unavailable) as e:
            watchdog.cancel()
            process.proc.kill()
            process.proc.wait()
            code, tail = process.proc.returncode, process.stderr_tail()
            process.close()
            _meteor = None
            if timed_out.is_set():
                raise Unavailable(f"METEOR did not finish within {timeout:g} s") from e
            raise Unavailable(f"METEOR failed ({e}); java exit code {code}: {tail}") from e
        watchdog.cancel()
        process.idle_timer = threading.Timer(METEOR_IDLE_SECONDS, _close_meteor, (process,))
        process.idle_timer.daemon = True
        process.idle_timer.start()
        return score


def spice(java: str, gts: dict, res: dict, timeout: float) -> float:
    """SPICE through coco-caption's jar, when Stanford CoreNLP 3.6.0 is present.

    `pycocoevalcap.spice.Spice` downloads CoreNLP on first use, which cannot work offline
    and may hang; here its absence makes SPICE unavailable instead.
    """
    spice_dir = os.path.dirname(os.path.abspath(_spice_module.__file__))
    needed = [
        _spice_module.SPICE_JAR,
        os.path.join("lib", "stanford-corenlp-3.6.0.jar"),
        os.path.join("lib", "stanford-corenlp-3.6.0-models.jar"),
    ]
    missing = [n for n in needed if not os.path.isfile(os.path.join(spice_dir, n))]
    if missing:
        raise Unavailable(
            f"SPICE needs {', '.join(missing)} in {spice_dir}; pycocoevalcap downloads "
            "Stanford CoreNLP 3.6.0 on first use, which needs network access (run "
            "pycocoevalcap.spice.get_stanford_models.get_stanford_models() once online)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        in_path, out_path = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
        with open(in_path, "w", encoding="utf-8") as f:
            json.dump(
                [{"image_id": i, "test": res[i][0], "refs": gts[i]} for i in res], f, indent=2
            )
        cmd = [java, "-jar", "-Xmx8G", _spice_module.SPICE_JAR, in_path, "-out", out_path]
        cmd += ["-subset", "-silent"]
        try:
            proc = subprocess.run(
                cmd, cwd=spice_dir, capture_output=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as e:
            raise Unavailable(f"SPICE did not finish within {timeout:g} s") from e
        except OSError as e:
            raise Unavailable(f"could not start java for SPICE: {e}") from e
        if proc.returncode != 0:
            raise Unavailable(f"SPICE exited with code {proc.returncode}: {_tail(proc.stderr)}")
        with open(out_path, encoding="utf-8") as f:
            results = json.load(f)
    values = []
    for item in results:
        f_score = item["scores"]["All"]["f"]
        values.append(float("nan") if f_score is None else float(f_score))
    return float(np.mean(values))
