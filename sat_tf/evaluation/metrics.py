"""Caption metrics: the coco-caption scorers, the paper's BLEU, and Table 1.

`coco_scores` gives the numbers captioning papers report, computed by the `pycocoevalcap`
scorers after PTB tokenization: BLEU-1..4, METEOR, ROUGE-L, CIDEr (CIDEr-D) and, where
its files are present, SPICE. `paper_bleu` gives BLEU-1..4 without the brevity penalty,
as in Table 1 of Xu et al. (2015), and `format_table1` lays both out next to the paper's
rows. `bleu4` is the quick corpus BLEU-4 the training loop selects models on (§4.3).

The PTB tokenizer, METEOR and SPICE are Java programs that ship inside `pycocoevalcap`.
They run here with the commands and line protocols of the `pycocoevalcap` wrappers, but
under a deadline and with their failures caught: a missing `java`, a missing jar, a
crash or a timeout makes that metric "unavailable" with the reason, never an exception
or a hang. Without Java the captions are tokenized by `simple_ptb_tokenize`.
"""

import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.meteor import meteor as _meteor_module
from pycocoevalcap.rouge.rouge import Rouge
from pycocoevalcap.spice import spice as _spice_module
from pycocoevalcap.tokenizer import ptbtokenizer as _ptb_module

BLEU_KEYS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4")
PAPER_BLEU_KEYS = tuple(f"paper {k} (no BP)" for k in BLEU_KEYS)
DEFAULT_JAVA_TIMEOUT = 1800.0

# Xu et al. (2015), Table 1: BLEU-1..4 (without brevity penalty) and METEOR, x100, as
# printed in the paper.
PAPER_TABLE1 = {
    "flickr8k": {
        "Soft-Attention": ("67", "44.8", "29.9", "19.5", "18.93"),
        "Hard-Attention": ("67", "45.7", "31.4", "21.3", "20.30"),
    },
    "flickr30k": {
        "Soft-Attention": ("66.7", "43.4", "28.8", "19.1", "18.49"),
        "Hard-Attention": ("66.9", "43.9", "29.6", "19.9", "18.46"),
    },
    "coco": {
        "Soft-Attention": ("70.7", "49.2", "34.4", "24.3", "23.90"),
        "Hard-Attention": ("71.8", "50.4", "35.7", "25.0", "23.04"),
    },
}

_DATASET_ALIASES = {"mscoco": "coco", "ms-coco": "coco", "coco2014": "coco"}

# coco-caption's BleuScorer guards its ratios with these; `paper_bleu` uses the same so
# that it equals coco-caption's BLEU whenever the brevity penalty is 1.
_TINY = 1e-15
_SMALL = 1e-9

_PUNCTUATIONS = frozenset(_ptb_module.PUNCTUATIONS)
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr vs etc mt ft inc ltd co corp prof gen sgt capt lt col rev".split()
)
_BRACKETS = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-"}
_CLITIC = re.compile(r"^(.*[a-z0-9])('s|'re|'ve|'ll|'d|'m)$")


class _Unavailable(Exception):
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


def _java() -> str | None:
    return shutil.which("java")


def _tail(data: bytes, limit: int = 400) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return text[-limit:] if text else "(no output on stderr)"


def _java_ptb_tokenize(java: str, sentences: list[str], timeout: float) -> list[str]:
    """Runs coco-caption's PTBTokenizer command on `sentences`, one per line."""
    jar_dir = os.path.dirname(os.path.abspath(_ptb_module.__file__))
    jar = os.path.join(jar_dir, _ptb_module.STANFORD_CORENLP_3_4_1_JAR)
    if not os.path.isfile(jar):
        raise _Unavailable(f"the PTB tokenizer jar {jar} is missing")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "captions.txt")
        with open(path, "w", encoding="utf-8", errors="replace") as f:
            f.write("".join(re.sub(r"\s", " ", s) + "\n" for s in sentences))
        cmd = [java, "-cp", jar, "edu.stanford.nlp.process.PTBTokenizer"]
        cmd += ["-preserveLines", "-lowerCase", path]
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as e:
            raise _Unavailable(f"the PTB tokenizer did not finish within {timeout:g} s") from e
        except OSError as e:
            raise _Unavailable(f"could not start java for the PTB tokenizer: {e}") from e
    if proc.returncode != 0:
        raise _Unavailable(
            f"the PTB tokenizer exited with code {proc.returncode}: {_tail(proc.stderr)}"
        )
    lines = proc.stdout.decode("utf-8", errors="replace").split("\n")
    if len(lines) < len(sentences):
        raise _Unavailable(
            f"the PTB tokenizer returned {len(lines)} lines for {len(sentences)} captions"
        )
    return [
        " ".join(w for w in line.rstrip().split(" ") if w not in _PUNCTUATIONS)
        for line in lines[: len(sentences)]
    ]


def _tokenize(
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
    java = _java()
    tokenizer = "PTBTokenizer (Stanford CoreNLP 3.4.1, java)"
    try:
        if java is None:
            raise _Unavailable("java not found on PATH")
        tokens = _java_ptb_tokenize(java, sentences, timeout)
    except _Unavailable as e:
        tokens = [simple_ptb_tokenize(s) for s in sentences]
        tokenizer = f"sat_tf.evaluation.metrics.simple_ptb_tokenize (Python), because {e}"
    res = {i: [tokens[k]] for k, i in enumerate(ids)}
    gts, k = {}, len(ids)
    for i in ids:
        gts[i] = tokens[k : k + len(references[i])]
        k += len(references[i])
    return gts, res, tokenizer


def _check_inputs(
    references: Mapping[str, Sequence[str]], hypotheses: Mapping[str, str]
) -> dict[str, list[str]]:
    """Validates the inputs; returns the references of the hypotheses' images."""
    if not isinstance(hypotheses, Mapping) or not isinstance(references, Mapping):
        raise ValueError("references and hypotheses must be dicts keyed by image id")
    if not hypotheses:
        raise ValueError("there are no hypotheses to score")
    refs = {}
    for image_id, hyp in hypotheses.items():
        if not isinstance(image_id, str):
            raise ValueError(f"image id {image_id!r} is not a string")
        if not isinstance(hyp, str):
            raise ValueError(f"the hypothesis of image {image_id!r} is not a string: {hyp!r}")
        if image_id not in references:
            raise ValueError(f"image {image_id!r} has a hypothesis but no references")
        ref_list = references[image_id]
        if isinstance(ref_list, str) or not isinstance(ref_list, Sequence):
            raise ValueError(f"the references of image {image_id!r} are not a list of strings")
        if not ref_list:
            raise ValueError(f"image {image_id!r} has an empty list of references")
        for ref in ref_list:
            if not isinstance(ref, str) or not ref.strip():
                raise ValueError(f"image {image_id!r} has an empty or non-string reference")
        refs[image_id] = list(ref_list)
    return refs


def _clean_meteor(text: str) -> str:
    return text.replace("|||", "").replace("  ", " ")


def _meteor(java: str, gts: dict, res: dict, timeout: float) -> float:
    """METEOR 1.5 through coco-caption's jar and `-stdio` protocol, with a deadline.

    As `pycocoevalcap.meteor.Meteor`: one `SCORE ||| refs ||| hyp` line per image, whose
    answers form the `EVAL` line; the last answer is the corpus score. A watchdog kills
    Java at the deadline, so a dead or stuck process ends in `_Unavailable`, not a hang.
    """
    jar_dir = os.path.dirname(os.path.abspath(_meteor_module.__file__))
    jar = _meteor_module.METEOR_JAR
    if not os.path.isfile(os.path.join(jar_dir, jar)):
        raise _Unavailable(f"the METEOR jar {jar} is missing in {jar_dir}")
    cmd = [java, "-jar", "-Xmx2G", jar, "-", "-", "-stdio", "-l", "en", "-norm"]
    timed_out = threading.Event()
    with tempfile.TemporaryFile() as stderr:
        try:
            proc = subprocess.Popen(
                cmd,
                cwd=jar_dir,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        except OSError as e:
            raise _Unavailable(f"could not start java for METEOR: {e}") from e

        def kill():
            timed_out.set()
            proc.kill()

        watchdog = threading.Timer(timeout, kill)
        watchdog.daemon = True
        watchdog.start()

        def ask(line: str, answers: int = 1) -> list[str]:
            proc.stdin.write((line + "\n").encode("utf-8"))
            proc.stdin.flush()
            out = [proc.stdout.readline().decode("utf-8").strip() for _ in range(answers)]
            if not all(out):
                raise _Unavailable("METEOR stopped answering")
            return out

        try:
            stats = []
            for image_id, hyp in res.items():
                refs = " ||| ".join(_clean_meteor(r) for r in gts[image_id])
                stats += ask(f"SCORE ||| {refs} ||| {_clean_meteor(hyp[0])}")
            answers = ask("EVAL ||| " + " ||| ".join(stats), len(stats) + 1)
            return float(answers[-1])
        except (OSError, ValueError, _Unavailable) as e:
            proc.kill()
            proc.wait()
            if timed_out.is_set():
                raise _Unavailable(f"METEOR did not finish within {timeout:g} s") from e
            stderr.seek(0)
            raise _Unavailable(
                f"METEOR failed ({e}); java exit code {proc.returncode}: {_tail(stderr.read())}"
            ) from e
        finally:
            watchdog.cancel()
            proc.kill()
            proc.wait()


def _spice(java: str, gts: dict, res: dict, timeout: float) -> float:
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
        raise _Unavailable(
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
            raise _Unavailable(f"SPICE did not finish within {timeout:g} s") from e
        except OSError as e:
            raise _Unavailable(f"could not start java for SPICE: {e}") from e
        if proc.returncode != 0:
            raise _Unavailable(f"SPICE exited with code {proc.returncode}: {_tail(proc.stderr)}")
        with open(out_path, encoding="utf-8") as f:
            results = json.load(f)
    values = []
    for item in results:
        f_score = item["scores"]["All"]["f"]
        values.append(float("nan") if f_score is None else float(f_score))
    return float(np.mean(values))


def coco_scores(
    references: Mapping[str, Sequence[str]],
    hypotheses: Mapping[str, str],
    *,
    use_spice: bool = False,
    java_timeout: float = DEFAULT_JAVA_TIMEOUT,
) -> dict:
    """The coco-caption metrics of one caption per image (Chen et al., 2015).

    Captions are PTB-tokenized (Java; `simple_ptb_tokenize` without it), then scored by
    `pycocoevalcap`'s Bleu(4), Meteor, Rouge and Cider, and Spice if asked for. Only the
    images that have a hypothesis are scored. Java failures do not raise: the metric is
    left out and listed under "unavailable".

    Args:
      references: image id -> reference captions (raw text).
      hypotheses: image id -> generated caption (raw text).
      use_spice: also compute SPICE (needs Java and Stanford CoreNLP 3.6.0 jars).
      java_timeout: seconds each Java program may run before it counts as failed.

    Returns:
      {"BLEU-1".."BLEU-4", "METEOR", "ROUGE-L", "CIDEr"[, "SPICE"]: float in [0, 1]
      (CIDEr in [0, 10]), "unavailable": {metric: reason}, "tokenizer": which one ran}.
      BLEU here includes the brevity penalty; see `paper_bleu` for the paper's BLEU.

    Raises:
      ValueError: a hypothesis has no references, an empty reference list, or a
        non-string caption; the message names the image id.
    """
    refs = _check_inputs(references, hypotheses)
    gts, res, tokenizer = _tokenize(refs, hypotheses, java_timeout)
    scores: dict = {}
    unavailable: dict[str, str] = {}
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    scores.update({key: float(value) for key, value in zip(BLEU_KEYS, bleu, strict=True)})
    java = _java()
    try:
        if java is None:
            raise _Unavailable("java not found on PATH (METEOR 1.5 is a Java program)")
        scores["METEOR"] = _meteor(java, gts, res, java_timeout)
    except _Unavailable as e:
        unavailable["METEOR"] = str(e)
    scores["ROUGE-L"] = float(Rouge().compute_score(gts, res)[0])
    scores["CIDEr"] = float(Cider().compute_score(gts, res)[0])
    if use_spice:
        try:
            if java is None:
                raise _Unavailable("java not found on PATH (SPICE is a Java program)")
            scores["SPICE"] = _spice(java, gts, res, java_timeout)
        except _Unavailable as e:
            unavailable["SPICE"] = str(e)
    scores["unavailable"] = unavailable
    scores["tokenizer"] = tokenizer
    return scores


def _ngram_counts(words: list[str], n: int) -> Counter:
    return Counter(
        tuple(words[i : i + k]) for k in range(1, n + 1) for i in range(len(words) - k + 1)
    )


def bleu_without_brevity_penalty(
    references: Mapping[str, Sequence[str]], hypotheses: Mapping[str, str], n: int = 4
) -> list[float]:
    """Corpus BLEU-1..n of tokenized captions with the brevity penalty fixed at 1.

    Clipped n-gram counts are summed over the corpus, p_k = correct_k / guessed_k, and
    BLEU-k = (p_1 ... p_k)^(1/k), with coco-caption's guards (1e-15 added to the counts,
    1e-9 to the totals), so this equals coco-caption's BLEU whenever the hypotheses are
    at least as long as their closest references.

    Args:
      references: image id -> tokenized references.
      hypotheses: image id -> tokenized hypothesis; every id must be in `references`.
      n: highest n-gram order.

    Returns:
      [BLEU-1, ..., BLEU-n].
    """
    correct, guessed = [0] * n, [0] * n
    for image_id, hyp in hypotheses.items():
        words = hyp.split()
        max_ref: Counter = Counter()
        for ref in references[image_id]:
            max_ref |= _ngram_counts(ref.split(), n)
        for ngram, count in _ngram_counts(words, n).items():
            correct[len(ngram) - 1] += min(count, max_ref[ngram])
        for k in range(n):
            guessed[k] += max(0, len(words) - k)
    scores, product = [], 1.0
    for k in range(n):
        product *= (correct[k] + _TINY) / (guessed[k] + _SMALL)
        scores.append(product ** (1.0 / (k + 1)))
    return scores


def paper_bleu(
    references: Mapping[str, Sequence[str]],
    hypotheses: Mapping[str, str],
    *,
    java_timeout: float = DEFAULT_JAVA_TIMEOUT,
) -> dict:
    """BLEU-1..4 without brevity penalty, as Table 1 of Xu et al. (2015) reports it.

    The captions are tokenized exactly as in `coco_scores`, then scored by
    `bleu_without_brevity_penalty`.

    Args:
      references: image id -> reference captions (raw text).
      hypotheses: image id -> generated caption (raw text).
      java_timeout: seconds the Java tokenizer may run.

    Returns:
      {"paper BLEU-1 (no BP)", ..., "paper BLEU-4 (no BP)": float in [0, 1]}.

    Raises:
      ValueError: as `coco_scores`.
    """
    refs = _check_inputs(references, hypotheses)
    gts, res, _ = _tokenize(refs, hypotheses, java_timeout)
    scores = bleu_without_brevity_penalty(gts, {i: h[0] for i, h in res.items()})
    return dict(zip(PAPER_BLEU_KEYS, scores, strict=True))


def bleu4(references: Mapping[str, Sequence[str]], hypotheses: Mapping[str, str]) -> float:
    """Corpus BLEU-4 of already tokenized captions, for model selection (paper §4.3).

    coco-caption's Bleu scorer (closest reference length, brevity penalty) on the words
    as given: no tokenizer and no Java, so it is fast enough to run every epoch.

    Args:
      references: image id -> reference captions, lowercase words joined by spaces.
      hypotheses: image id -> generated caption, likewise.

    Returns:
      BLEU-4 in [0, 1].

    Raises:
      ValueError: as `coco_scores`.
    """
    refs = _check_inputs(references, hypotheses)
    res = {i: [h] for i, h in hypotheses.items()}
    bleu, _ = Bleu(4).compute_score(refs, res, verbose=0)
    return float(bleu[3])


def _cell(scores: Mapping, key: str, digits: int) -> str:
    value = scores.get(key)
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{100 * value:.{digits}f}"


def format_table1(scores: Mapping, dataset: str, model_name: str) -> str:
    """A Markdown table laid out like Table 1 of Xu et al. (2015).

    Columns BLEU-1..4 and METEOR, values x100 as the paper prints them. The paper's BLEU
    is computed without brevity penalty, so this model gets a row for that BLEU
    ("paper BLEU-k (no BP)" keys, from `paper_bleu`), comparable to the paper's rows, and
    a row for coco-caption's BLEU with brevity penalty ("BLEU-k" keys, from
    `coco_scores`); rows whose keys are absent are left out. For "flickr8k", "flickr30k"
    and "coco" the paper's soft- and hard-attention rows follow.

    Args:
      scores: metric name -> value in [0, 1], e.g. `coco_scores` merged with `paper_bleu`.
      dataset: dataset name; selects the paper's rows.
      model_name: the name to print for this model.

    Returns:
      The table and a note on its sources, as Markdown.
    """
    header = "| Model | BLEU-1 | BLEU-2 | BLEU-3 | BLEU-4 | METEOR |"
    lines = [f"Table 1 layout (Xu et al., 2015): {dataset}", "", header, "|---" * 6 + "|"]
    meteor = _cell(scores, "METEOR", 2)
    for keys, label in (
        (PAPER_BLEU_KEYS, "BLEU without brevity penalty, as the paper"),
        (BLEU_KEYS, "coco-caption BLEU, with brevity penalty"),
    ):
        if any(k in scores for k in keys):
            values = [_cell(scores, k, 1) for k in keys]
            lines.append(f"| {model_name} ({label}) | {' | '.join(values)} | {meteor} |")
    paper_rows = PAPER_TABLE1.get(_DATASET_ALIASES.get(dataset.lower(), dataset.lower()), {})
    for name, values in paper_rows.items():
        lines.append(f"| {name} (Xu et al., 2015) | {' | '.join(values)} |")
    lines.append("")
    note = "Values x100. METEOR from coco-caption's METEOR 1.5."
    if paper_rows:
        note += " Paper rows: Xu et al. (2015), Table 1, whose BLEU has no brevity penalty."
    lines.append(note)
    return "\n".join(lines) + "\n"


def to_coco_results(captions: Mapping[str, str]) -> list[dict]:
    """Captions in the COCO results format, [{"image_id", "caption"}, ...].

    Args:
      captions: image id -> caption.

    Returns:
      One dict per image; "image_id" is an int when the id is all ASCII digits (COCO's
      ids), else the string.
    """
    results = []
    for image_id, caption in captions.items():
        if not isinstance(image_id, str) or not isinstance(caption, str):
            raise ValueError(f"caption {image_id!r}: {caption!r} is not a pair of strings")
        key = int(image_id) if re.fullmatch(r"[0-9]+", image_id) else image_id
        results.append({"image_id": key, "caption": caption})
    return results


def write_results(path: str, captions: Mapping[str, str]) -> None:
    """Writes `to_coco_results(captions)` as JSON to `path` atomically (temp + rename).

    Args:
      path: the JSON file to write; its directory is created if needed.
      captions: image id -> caption.
    """
    results = to_coco_results(captions)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(results, f, ensure_ascii=False, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
