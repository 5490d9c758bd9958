"""The layout of sat_tf/, read from the source with `ast`.

The top level holds `__init__.py`, `config.py` and the layers' subpackages (and the
shipped presets, which are data). The layers are floors, each importing only the floors
below it: `utils/` (files, messages, the machine) imports nothing of the package;
`config.py`; `data/` (readers, vocabulary, pixels, tf.data, the feature cache's format)
and `backbones/` (weight porting); `model/` (the paper, with what the project adds
beside it in modules of its own) and `evaluation/` (scores and pictures); `serving/`
(inference: the API, presets, the export), which never goes through training; then, side
by side and apart, `server/` (the model server and the demo page, a room of small modules
over the exports) and `training/`; the Beam pipelines of `pipelines/`; the console
commands of `cli/`. Within a floor, finer rules: the model reads of `data/` only the
vocabulary's ids, never a reader; the modules the model keeps beside the paper
(self-critical training, the decoding rules, the location prior, the Keras base class that
makes training resume) import none of the paper's; the preset format never imports the
model; and the console commands that caption never load training code. Imports inside
functions count as much as those at the top.

Sizes, in lines of code (docstrings, comments and blank lines not counted): the paper's
modules of `model/` (without `fast/` and what sits beside the paper) are read top to
bottom in a few files; no module, class or function outside `fast/` grows past what a
reader holds at once. Every module with logic has a test file of its name.

One source for every setting: a class of the package (a dataclass's field, a NamedTuple's,
an `__init__`'s parameter) that has a default for a `Config` setting has Config's own,
read from it (`Config.name`) or equal to it; and the allowed values of a setting
(`config.CHOICES`) are written nowhere else.
"""

import ast
import dataclasses
import inspect
import io
import json
import os
import subprocess
import sys
import textwrap
import tokenize

import pytest

from sat_tf import config as config_lib
from sat_tf.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What sat_tf/ holds: its modules, its subpackages, and folders of data.
TOP_MODULES = ("__init__.py", "config.py")
PACKAGES = (
    "backbones",
    "cli",
    "data",
    "evaluation",
    "model",
    "pipelines",
    "server",
    "serving",
    "training",
    "utils",
)
DATA_FOLDERS = ("presets",)  # the shipped presets: setup.py's package_data, PRESETS_DIR

# The floors, lowest first: a part imports only parts of the floors below its own.
# "sat_tf" is the package's `__init__.py` (its version, its folder), "config" config.py.
FLOORS = (
    ("sat_tf", "utils"),
    ("config",),
    ("data", "backbones"),
    ("model", "evaluation"),
    ("serving",),
    ("server", "training"),
    ("pipelines",),
    ("cli",),
)
# The model's modules that are the paper; beside them, what the project adds and keeps
# apart: the model imports these, they import none of the paper's modules.
PAPER = ("attention", "decoder", "encoder", "losses", "search", "show_attend_tell", "step")
BESIDE_THE_PAPER = (
    "decoding_rules",
    "location_prior",
    "per_image",
    "resumable",
    "sampling",
    "self_critical",
)
# Modules held to more than their floor: module (or package) -> what it may not import.
MODULE_RULES = {
    "sat_tf.serving.preset": ("sat_tf.model",),
    **{
        f"sat_tf.model.{name}": (*(f"sat_tf.model.{p}" for p in PAPER), "sat_tf.model.fast")
        for name in BESIDE_THE_PAPER
    },
}
# The model reads no data files: of data/ it imports the vocabulary's ids only.
MODEL_READS_OF_DATA = ("sat_tf.data.vocab", "sat_tf.data.tokens")
# The commands and the API that caption: nothing they import, at any depth, is training's.
CAPTION_PATH = ("sat_tf.cli.caption", "sat_tf.cli.demo", "sat_tf.cli.export", "sat_tf.serving.api")
# What captioning one photo with the shipped preset runs (bench/caption_path.py, traced
# with tf.functions run eagerly): at most this many package files with a function run,
# and code lines of the functions run (the command's also check its flags and inputs
# before TensorFlow loads, sat_tf/data/image_files.py; beam search's per-image constants,
# sat_tf/model/per_image.py, are one file and ~120 lines of each, with its step of the
# images that hold a live hypothesis, the settled ones and its walk back through the
# attention history; the encoder's batch norms folded, sat_tf/model/fast/folded_encoder.py,
# one file and ~75 lines; the header walk, the API's image inputs and the off-world
# statistics in modules of their own, without TensorFlow, 3 files and ~50 lines; the
# command's choice of runtime ~50; several captions a photo, the beam's n best or n drawn
# ones, their arguments checked and each made a `Caption`, ~75 lines of the api's and ~95
# of the command's); never a line of training code. `litert`: the command on LiteRT, its
# file built first.
CAPTION_RUNS = {"command": (31, 2300), "api": (26, 1900), "litert": (17, 1000)}

# Size limits in lines of code (`code_lines`).
MODEL_FILES = 8  # the paper's modules of sat_tf/model/ and its __init__.py
# 1,000 until beam search kept each image's annotations once (per_image.py), 1,010 until
# its step took the images that hold a live hypothesis apart (`search._advance`) and
# stopped at the settled ones, 1,050 until it converted to TFLite (its TensorArrays'
# static batch) and decoding returned several captions of an image (the beam's n best, or
# n drawn ones).
MODEL_CODE_LINES = 1070
MODULE_CODE_LINES = 450
CLASS_CODE_LINES = 300
FUNCTION_CODE_LINES = 80  # outside model/fast/
LOGIC_CODE_LINES = 30  # a module this long has a test file of its name

# Modules with logic and no test file of their name: module -> where they are tested.
TESTED_ELSEWHERE: dict[str, str] = {}


def code_lines(source):
    """The numbers of the lines of `source` that hold code: not blank, not only a
    comment, not part of a docstring (of the module, a class or a function)."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines = set()
    skipped = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (*skipped, tokenize.ENDMARKER):
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - docstrings


def sizes(package_root):
    """{name: code lines} of every module (`sat_tf/a/b.py`) and of every class and
    function in it (`sat_tf/a/b.py::name`, nested ones too)."""
    found = {}
    for folder, _, names in os.walk(package_root):
        for file_name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(folder, file_name)
            where = os.path.relpath(path, os.path.dirname(package_root)).replace(os.sep, "/")
            with open(path, encoding="utf-8") as f:
                source = f.read()
            lines = code_lines(source)
            found[where] = len(lines)
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    inside = range(node.lineno, node.end_lineno + 1)
                    found[f"{where}::{node.name}"] = len(lines.intersection(inside))
    return found


def size_problems(package_root):
    """Every size over its limit, as lines."""
    problems = []
    model = {}
    for name, lines in sizes(package_root).items():
        module, _, inner = name.partition("::")
        if _in_the_paper(module) and not inner:
            model[module] = lines
        if not inner:
            limit = MODULE_CODE_LINES
        elif isinstance(_kind(package_root, module, inner), ast.ClassDef):
            limit = CLASS_CODE_LINES
        elif module.startswith("sat_tf/model/fast/"):
            continue
        else:
            limit = FUNCTION_CODE_LINES
        if lines > limit:
            problems.append(f"{name}: {lines} lines of code, more than {limit}")
    if len(model) > MODEL_FILES:
        problems.append(f"sat_tf/model/ holds {len(model)} files, more than {MODEL_FILES}")
    if sum(model.values()) > MODEL_CODE_LINES:
        problems.append(
            f"sat_tf/model/ holds {sum(model.values())} lines of code, more than {MODEL_CODE_LINES}"
        )
    return problems


def _in_the_paper(module):
    """Whether `sat_tf/a/b.py` is one of the model's modules that write the paper."""
    folder, _, name = module.rpartition("/")
    return folder == "sat_tf/model" and name[: -len(".py")] not in BESIDE_THE_PAPER


def _kind(package_root, module, name):
    path = os.path.join(os.path.dirname(package_root), *module.split("/"))
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return next(
        n for n in ast.walk(tree) if getattr(n, "name", None) == name and hasattr(n, "body")
    )


def _module_name(package_root, path):
    relative = os.path.relpath(path, os.path.dirname(package_root))[: -len(".py")]
    parts = relative.split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_module(package_root, dotted):
    """Whether `sat_tf.a.b` names a module or package file under `package_root`."""
    path = os.path.join(os.path.dirname(package_root), *dotted.split("."))
    return os.path.isfile(path + ".py") or os.path.isdir(path)


def _imports(package_root, path):
    """The sat_tf modules a file imports, anywhere in it: {dotted name: line}."""
    name = _module_name(package_root, path)
    is_package = path.endswith("__init__.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join([*anchor, base] if base else anchor)
            targets = []
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                targets.append(candidate if _is_module(package_root, candidate) else base)
        else:
            continue
        for target in targets:
            if target == "sat_tf" or target.startswith("sat_tf."):
                found.setdefault(target, node.lineno)
    return found


def part_of(dotted):
    """`sat_tf.data.vocab` -> "data", `sat_tf.config` -> "config", `sat_tf` -> "sat_tf"."""
    pieces = dotted.split(".")
    return pieces[1] if len(pieces) > 1 else "sat_tf"


def import_graph(package_root):
    """{(file path relative to the package's parent, line, imported module): importing
    module} for every import of a sat_tf module by a file of `package_root`."""
    edges = {}
    for folder, _, names in os.walk(package_root):
        for file_name in sorted(names):
            if not file_name.endswith(".py"):
                continue
            path = os.path.join(folder, file_name)
            importer = _module_name(package_root, path)
            where = os.path.relpath(path, os.path.dirname(package_root)).replace(os.sep, "/")
            for target, line in _imports(package_root, path).items():
                edges[(where, line, target)] = importer
    return edges


def _within(dotted, prefix):
    return dotted == prefix or dotted.startswith(prefix + ".")


def _floor(part):
    return next((i for i, floor in enumerate(FLOORS) if part in floor), None)


def broken_rule(importer, target):
    """Why module `importer` may not import module `target` (dotted names), or None."""
    source, imported = part_of(importer), part_of(target)
    if _floor(source) is None or _floor(imported) is None:
        return f"{source if _floor(source) is None else imported} is on no floor"
    if imported != source and _floor(imported) >= _floor(source):
        return f"{source} may not import {imported}"
    for module, banned in MODULE_RULES.items():
        if _within(importer, module):
            for prefix in banned:
                if _within(target, prefix):
                    return f"{module} may not import {prefix}"
    if source == "model" and imported == "data" and target not in MODEL_READS_OF_DATA:
        return "model may not import data readers"
    return None


def _cycles(parts_graph):
    """Loops among parts: each strongly connected component of more than one part."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(parts_graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(parts_graph):
        if node not in index:
            visit(node)
    return found


def violations(package_root):
    """Every import against the floors and `MODULE_RULES`, and every loop between parts,
    as lines."""
    problems, parts_graph, witness = [], {}, {}
    for (where, line, target), importer in sorted(import_graph(package_root).items()):
        source, imported = part_of(importer), part_of(target)
        rule = broken_rule(importer, target)
        if rule:
            problems.append(f"{where}:{line} imports {target}: {rule}")
        if imported != source:
            parts_graph.setdefault(source, set()).add(imported)
            witness.setdefault((source, imported), f"{where}:{line} imports {target}")
    for component in _cycles(parts_graph):
        links = [witness[(a, b)] for a in component for b in component if (a, b) in witness]
        problems.append(f"parts {', '.join(component)} import each other: " + "; ".join(links))
    return problems


def top_level_problems(package_root):
    """What sat_tf/ holds beside `TOP_MODULES`, `PACKAGES` and `DATA_FOLDERS`, and what
    of those it lacks, as lines."""
    problems = []
    held = {n for n in os.listdir(package_root) if n != "__pycache__"}
    for name in sorted(held - {*TOP_MODULES, *PACKAGES, *DATA_FOLDERS}):
        what = "a module" if name.endswith(".py") else "a folder"
        problems.append(f"sat_tf/{name} is {what} at the top level")
    for name in PACKAGES:
        if not os.path.isfile(os.path.join(package_root, name, "__init__.py")):
            problems.append(f"sat_tf/{name}/ is not a package")
    for name in sorted({*TOP_MODULES, *DATA_FOLDERS} - held):
        problems.append(f"sat_tf/{name} is missing")
    return problems


def untested_modules(package_root, tests_dir):
    """Every module of `package_root` with `LOGIC_CODE_LINES` lines of code or more and no
    `<name>_test.py` in `tests_dir` (a package's `__init__.py`: its package's name), as
    `sat_tf/a/b.py`; modules generated from a `.proto` (`*_pb2.py`) are tested by
    tests/protos_test.py."""
    tests = set(os.listdir(tests_dir))
    untested = []
    for name, lines in sizes(package_root).items():
        folder, _, file_name = name.rpartition("/")
        # A package's __init__.py goes by the package's name.
        stem = os.path.basename(folder) if file_name == "__init__.py" else file_name[:-3]
        generated = file_name.endswith("_pb2.py")  # grpcio-tools' modules of a .proto
        if (
            "::" not in name
            and not generated
            and lines >= LOGIC_CODE_LINES
            and f"{stem}_test.py" not in tests
        ):
            untested.append(name)
    return sorted(untested)


def _closure(graph, start):
    """The sat_tf modules `start` imports, directly or through others, with the packages
    around them (importing `a.b.c` runs `a.b`'s `__init__.py`)."""
    imports = {}
    for (_, _, target), importer in graph.items():
        imports.setdefault(importer, set()).add(target)
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        pieces = module.split(".")
        for i in range(1, len(pieces) + 1):
            name = ".".join(pieces[:i])
            if name not in seen:
                seen.add(name)
                todo.extend(imports.get(name, ()))
    return seen


def test_the_top_level_holds_only_init_config_and_packages():
    assert top_level_problems(os.path.join(ROOT, "sat_tf")) == []


def test_every_part_stands_on_a_floor():
    parts = [part for floor in FLOORS for part in floor]
    assert sorted(parts) == sorted({"sat_tf", "config", *PACKAGES})
    model = os.path.join(ROOT, "sat_tf", "model")
    modules = {n[: -len(".py")] for n in os.listdir(model) if n.endswith(".py")}
    assert modules == {"__init__", *PAPER, *BESIDE_THE_PAPER}


def test_the_package_imports_one_way():
    package = os.path.join(ROOT, "sat_tf")
    assert violations(package) == []


def test_captioning_loads_no_training_code():
    graph = import_graph(os.path.join(ROOT, "sat_tf"))
    for start in CAPTION_PATH:
        loaded = _closure(graph, start)
        assert start in loaded
        assert not [m for m in loaded if _within(m, "sat_tf.training")], start


@pytest.mark.parametrize("way", ["api", "command", pytest.param("litert", marks=pytest.mark.slow)])
def test_captioning_a_photo_runs_no_training_code(way, tmp_path):
    from PIL import Image

    from sat_tf.backbones import efficientnet_lite

    image = str(tmp_path / "photo.png")
    Image.new("RGB", (64, 48), (200, 60, 40)).save(image)
    cache = {"SAT_TF_CACHE": str(tmp_path / "cache")}
    # As from the second caption on: the ImageNet weights were ported at the first.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SAT_TF_CACHE", cache["SAT_TF_CACHE"])
        efficientnet_lite.state_dict.__wrapped__(efficientnet_lite.imagenet_weights_path())
    if way == "litert":  # its TFLite file built first, untraced, as the bench does
        caption = [sys.executable, os.path.join(ROOT, "scripts", "caption.py"), image]
        built = subprocess.run(
            [*caption, "--runtime=litert"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, **cache},
        )
        assert built.returncode == 0, built.stderr[-2000:]
    bench = os.path.join(ROOT, "bench", "caption_path.py")
    done = subprocess.run(
        [sys.executable, bench, f"--way={way}", f"--image={image}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **cache},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.split("REPORT ", 1)[1])
    assert report["training_code_ran"] == []
    files, lines = CAPTION_RUNS[way]
    assert report["files_run"] <= files, report["lines_per_file"]
    assert report["function_code_lines"] <= lines, report["lines_per_file"]


def test_sizes_stay_within_their_limits():
    assert size_problems(os.path.join(ROOT, "sat_tf")) == []


def test_every_module_with_logic_has_a_test_file_of_its_name():
    untested = untested_modules(os.path.join(ROOT, "sat_tf"), os.path.join(ROOT, "tests"))
    assert untested == sorted(TESTED_ELSEWHERE)


def test_code_lines_leave_out_docstrings_comments_and_blank_lines():
    source = textwrap.dedent(
        '''\
        """Module docstring,
        two lines."""

        # a comment
        x = (1,
             2)  # trailing comment


        def f():
            """Docstring."""
            return x
        '''
    )
    assert sorted(code_lines(source)) == [5, 6, 9, 11]


def test_a_planted_long_function_is_found(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_CODE_LINES))
    root = _tree(tmp_path, {"training/loop.py": f"def run():\n{body}    return x0\n"})
    assert size_problems(root) == [
        f"sat_tf/training/loop.py::run: {FUNCTION_CODE_LINES + 2} lines of code, more than "
        f"{FUNCTION_CODE_LINES}"
    ]


def test_the_helpers_beside_the_paper_are_not_counted_as_the_paper(tmp_path):
    lines = MODEL_CODE_LINES // 3 + 1
    body = "".join(f"x{i} = {i}\n" for i in range(lines))
    files = {f"model/{name}.py": body for name in ("decoder", "search", "self_critical")}
    files["model/decoding_rules.py"] = body
    assert size_problems(_tree(tmp_path, files)) == []
    files["model/step.py"] = body
    assert size_problems(_tree(tmp_path, files)) == [
        f"sat_tf/model/ holds {3 * lines} lines of code, more than {MODEL_CODE_LINES}"
    ]


def test_planted_top_level_modules_and_folders_are_found(tmp_path):
    root = _tree(tmp_path, {"config.py": "", "files.py": "", "serving/api.py": ""})
    (tmp_path / "sat_tf" / "assets").mkdir()
    made = {"data", "model", "training", "evaluation", "serving", "server", "utils"}
    for name in set(PACKAGES) - made:
        (tmp_path / "sat_tf" / name).mkdir()
        (tmp_path / "sat_tf" / name / "__init__.py").write_text("")
    assert top_level_problems(root) == [
        "sat_tf/assets is a folder at the top level",
        "sat_tf/files.py is a module at the top level",
        "sat_tf/presets is missing",
    ]


def test_a_module_with_logic_and_no_test_file_is_found(tmp_path):
    lines = [f"x{i} = {i}\n" for i in range(LOGIC_CODE_LINES)]
    files = {"data/reader.py": "".join(lines), "data/small.py": "".join(lines[1:])}
    files["data/reader_config_pb2.py"] = "".join(lines)  # generated, tested by protos_test
    root = _tree(tmp_path, files)
    tests = tmp_path / "tests"
    tests.mkdir()
    assert untested_modules(root, str(tests)) == ["sat_tf/data/reader.py"]
    (tests / "reader_test.py").write_text("")
    assert untested_modules(root, str(tests)) == []


def test_the_graph_sees_the_imports_that_exist():
    graph = import_graph(os.path.join(ROOT, "sat_tf"))
    modules = {(importer, target) for (_, _, target), importer in graph.items()}
    parts = {(part_of(a), part_of(b)) for a, b in modules}
    # training/ is where data and model meet; the model reads the vocabulary's ids.
    assert {("training", "model"), ("training", "data"), ("model", "data")} <= parts
    assert {("serving", "model"), ("serving", "data"), ("training", "serving")} <= parts
    assert ("server", "serving") in parts
    assert {("data", "utils"), ("config", "utils"), ("model", "backbones")} <= parts
    assert not [b for a, b in modules if _within(a, "sat_tf.training") and "exporting" in b]
    serving = {("api", "inference"), ("inference", "tags"), ("inference", "preset")}
    assert {(f"sat_tf.serving.{a}", f"sat_tf.serving.{b}") for a, b in serving} <= modules
    beside = {("search", "decoding_rules"), ("attention", "location_prior")}
    beside |= {("show_attend_tell", "self_critical"), ("show_attend_tell", "resumable")}
    assert {(f"sat_tf.model.{a}", f"sat_tf.model.{b}") for a, b in beside} <= modules


def _tree(tmp_path, files):
    root = tmp_path / "sat_tf"
    for name in ("", "data", "model", "training", "evaluation", "serving", "server", "utils"):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "__init__.py").write_text("")
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return str(root)


def test_a_planted_data_to_model_import_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "model/encoder.py": "import os\n",
            "data/cache.py": """\
                import os


                def extract():
                    from sat_tf.model.encoder import ImageEncoder
                    return ImageEncoder
                """,
        },
    )
    assert violations(root) == [
        "sat_tf/data/cache.py:5 imports sat_tf.model.encoder: data may not import model"
    ]


@pytest.mark.parametrize(
    "importer, imported, message",
    [
        ("serving/api.py", "training/loop.py", "serving may not import training"),
        ("serving/inference.py", "training/loop.py", "serving may not import training"),
        ("serving/preset.py", "model/step.py", "sat_tf.serving.preset may not import sat_tf.model"),
        ("serving/preset.py", "training/loop.py", "serving may not import training"),
        ("model/step.py", "serving/api.py", "model may not import serving"),
        ("model/step.py", "data/coco.py", "model may not import data readers"),
        (
            "model/self_critical.py",
            "model/step.py",
            "sat_tf.model.self_critical may not import sat_tf.model.step",
        ),
        ("utils/files.py", "config.py", "utils may not import config"),
        ("data/vocab.py", "serving/preset.py", "data may not import serving"),
        ("serving/exporting.py", "server/manager.py", "serving may not import server"),
        ("training/loop.py", "server/manager.py", "training may not import server"),
        ("server/manager.py", "training/loop.py", "server may not import training"),
    ],
)
def test_planted_imports_against_the_floors_are_found(tmp_path, importer, imported, message):
    target = "sat_tf." + imported[: -len(".py")].replace("/", ".")
    root = _tree(tmp_path, {imported: "", importer: f"import {target}\n"})
    assert violations(root) == [f"sat_tf/{importer}:1 imports {target}: {message}"]


def test_the_model_reads_the_vocabulary_and_helpers_import_each_other(tmp_path):
    files = {"data/vocab.py": "", "data/tokens.py": "", "model/decoding_rules.py": ""}
    files["model/self_critical.py"] = "from sat_tf.model import decoding_rules\n"
    files["model/step.py"] = "from sat_tf.data import tokens, vocab\n"
    assert violations(_tree(tmp_path, files)) == []


def test_the_model_may_not_import_the_serving_layer(tmp_path):
    files = {"serving/preset.py": "", "model/step.py": "from sat_tf.serving import preset\n"}
    (problem,) = violations(_tree(tmp_path, files))
    assert problem.startswith("sat_tf/model/step.py:1 imports sat_tf.serving.preset")


@pytest.mark.parametrize(
    "statement, target",
    [
        ("from sat_tf import training", "sat_tf.training"),
        ("from sat_tf.training import loop", "sat_tf.training.loop"),
        ("import sat_tf.training.loop", "sat_tf.training.loop"),
        ("from ..training import loop", "sat_tf.training.loop"),
        ("from ..training.loop import run", "sat_tf.training.loop"),
    ],
)
def test_every_spelling_of_an_import_is_found(tmp_path, statement, target):
    root = _tree(tmp_path, {"training/loop.py": "", "model/step.py": f"{statement}\n"})
    assert violations(root) == [
        f"sat_tf/model/step.py:1 imports {target}: model may not import training"
    ]


def test_a_planted_loop_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "training/loop.py": "from sat_tf.serving import exporting\n",
            "serving/exporting.py": "from sat_tf.training import loop\n",
            "evaluation/score.py": "from sat_tf.data import vocab\n",
            "data/vocab.py": "from sat_tf.evaluation import score\n",
        },
    )
    assert violations(root) == [
        "sat_tf/data/vocab.py:1 imports sat_tf.evaluation.score: data may not import evaluation",
        "sat_tf/serving/exporting.py:1 imports sat_tf.training.loop: serving may not import "
        "training",
        "parts data, evaluation import each other: sat_tf/data/vocab.py:1 imports "
        "sat_tf.evaluation.score; sat_tf/evaluation/score.py:1 imports sat_tf.data.vocab",
        "parts serving, training import each other: sat_tf/serving/exporting.py:1 imports "
        "sat_tf.training.loop; sat_tf/training/loop.py:1 imports sat_tf.serving.exporting",
    ]


# Parameters named like a `Config` setting that hold another quantity, so that their
# defaults are not the setting's: (file, class, name) -> what they hold.
OTHER_MEANINGS = {
    ("sat_tf/serving/api.py", "Captioner", "batch_size"): "images captioned at once",
    ("sat_tf/serving/litert.py", "LiteRTCaptioner", "batch_size"): "images captioned at once",
    ("sat_tf/backbones/registry.py", "EncoderSpec", "image_size"): "the backbone's own input",
    ("sat_tf/data/folder.py", "_Row", "captions"): "a row's captions, not the captions file",
    ("sat_tf/model/show_attend_tell.py", "ShowAttendTell", "encoder"): "the layer, not a name",
}
# Literal tuples of a setting's allowed values outside config.py that are not a second
# declaration of them: (file, setting) -> why.
CHOICES_ELSEWHERE = {
    ("sat_tf/training/decoding_choice.py", "hard_decoding"): "SEARCH: the order tried in",
    ("sat_tf/data/records.py", "on_missing"): "records.check_options, for its owner to turn "
    "into config.check_choice('on_missing', ...)",
}


def _class_defaults(tree):
    """(class name, name, default expression) of every field with a default (an annotated
    assignment in the class body) and every `__init__` parameter with one."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                if item.value is not None:
                    yield node.name, item.target.id, item.value
            elif isinstance(item, ast.FunctionDef) and item.name == "__init__":
                args = item.args
                positional = args.posonlyargs + args.args
                with_default = positional[len(positional) - len(args.defaults) :]
                pairs = list(zip(with_default, args.defaults, strict=True))
                pairs += zip(args.kwonlyargs, args.kw_defaults, strict=True)
                for arg, value in pairs:
                    if value is not None:
                        yield node.name, arg.arg, value


def _config_reference(value):
    """The setting whose default `value` reads: "x" for `Config.x` (`config.Config.x`
    too) and for `dataclasses.field(default=Config.x, ...)`; else None."""
    function = value.func if isinstance(value, ast.Call) else None
    if function is not None and getattr(function, "attr", getattr(function, "id", "")) == "field":
        inner = [k.value for k in value.keywords if k.arg == "default"]
        return _config_reference(inner[0]) if inner else None
    if isinstance(value, ast.Attribute):
        owner = value.value
        if getattr(owner, "id", None) == "Config" or getattr(owner, "attr", None) == "Config":
            return value.attr
    return None


def default_problems(package_root, defaults):
    """Every default of a class of `package_root` for a setting of `defaults` ({name:
    Config's default}) that is not Config's, as lines."""
    problems = []
    for folder, _, names in os.walk(package_root):
        for file_name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(folder, file_name)
            where = os.path.relpath(path, os.path.dirname(package_root)).replace(os.sep, "/")
            if where == "sat_tf/config.py":
                continue
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for cls, name, value in _class_defaults(tree):
                reference = _config_reference(value)
                if reference is not None:
                    if reference not in defaults:
                        problems.append(f"{where}::{cls}.{name}: no setting {reference!r}")
                    continue
                if name not in defaults or (where, cls, name) in OTHER_MEANINGS:
                    continue
                try:
                    own = ast.literal_eval(value)
                except ValueError:
                    own = ast.unparse(value)
                if own != defaults[name] or type(own) is not type(defaults[name]):
                    problems.append(
                        f"{where}::{cls}.{name}: default {ast.unparse(value)}, Config's "
                        f"{defaults[name]!r}"
                    )
    return problems


def _config_defaults():
    return {f.name: f.default for f in dataclasses.fields(Config)}


def choice_problems(package_root, choices):
    """Every literal tuple, list or set outside config.py that holds exactly the allowed
    values of a setting of `choices` (`config.CHOICES`), as lines."""
    problems = []
    for folder, _, names in os.walk(package_root):
        for file_name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(folder, file_name)
            where = os.path.relpath(path, os.path.dirname(package_root)).replace(os.sep, "/")
            if where == "sat_tf/config.py":
                continue
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if not isinstance(node, (ast.Tuple, ast.List, ast.Set)) or len(node.elts) < 2:
                    continue
                if not all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
                ):
                    continue
                values = {e.value for e in node.elts}
                for name, allowed in choices.items():
                    if values == set(allowed) and (where, name) not in CHOICES_ELSEWHERE:
                        problems.append(
                            f"{where}:{node.lineno} repeats the choices of --{name}: "
                            f"{ast.unparse(node)} (config.CHOICES, config.check_choice)"
                        )
    return problems


def test_no_class_holds_a_default_of_its_own_for_a_setting():
    assert default_problems(os.path.join(ROOT, "sat_tf"), _config_defaults()) == []


def test_the_parts_settings_have_configs_defaults_or_none():
    # What the classes hold when imported, beside what their source says (above); the
    # decoder's vocab_size is the vocabulary's size, not --vocab_size.
    from sat_tf.model import decoder, losses, self_critical
    from sat_tf.serving import exporting

    defaults = _config_defaults()
    scst = {"samples": "scst_samples", "baseline": "scst_baseline"}
    scst |= {"max_length": "max_caption_length", "entropy_weight": "scst_entropy_weight"}
    parts = [(losses.Settings, {}), (decoder.AttentionDecoder, {"vocab_size": None})]
    parts += [(self_critical.SelfCriticalSettings, scst), (exporting.ExportSpec, {})]
    for part, settings in parts:
        for name, parameter in inspect.signature(part).parameters.items():
            setting = settings.get(name, name)
            if setting in defaults and parameter.default is not inspect.Parameter.empty:
                assert parameter.default == defaults[setting], (part.__name__, name)
    assert losses.Settings() == losses.Settings(**config_lib.arguments(losses.Settings, Config()))


def test_allowed_values_are_declared_once():
    assert choice_problems(os.path.join(ROOT, "sat_tf"), config_lib.CHOICES) == []


def test_a_planted_default_of_its_own_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "model/parts.py": """\
                import dataclasses
                from dataclasses import field

                from sat_tf import config
                from sat_tf.config import Config


                @dataclasses.dataclass
                class Settings:
                    reinforce_reward: str = "sequence"
                    reinforce_weight: float = Config.reinforce_weight
                    hard_mix_prob: float = 0.5
                    entropy_weight: float = field(default=config.Config.scst_entropy_weight)
                    beam: int = Config.beam


                class Layer:
                    def __init__(self, vocab_size, hidden_dim=64, *, hard_gate=True, seed=None):
                        pass
                """,
        },
    )
    defaults = {"reinforce_reward": "to_go", "reinforce_weight": 1.0, "hard_mix_prob": 0.5}
    defaults |= {"hidden_dim": 256, "hard_gate": True, "seed": 0, "vocab_size": 10}
    defaults |= {"scst_entropy_weight": 0.0, "entropy_weight": 0.002}
    assert default_problems(root, defaults) == [
        "sat_tf/model/parts.py::Settings.reinforce_reward: default 'sequence', Config's 'to_go'",
        "sat_tf/model/parts.py::Settings.beam: no setting 'beam'",
        "sat_tf/model/parts.py::Layer.hidden_dim: default 64, Config's 256",
        "sat_tf/model/parts.py::Layer.seed: default None, Config's 0",
    ]


def test_planted_choices_are_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "model/parts.py": """\
                BASELINES = ("greedy", "mean")
                PARTLY = ("mean",)


                def check(reward):
                    return reward in ["sequence", "to_go", "other"]
                """,
        },
    )
    choices = {"scst_baseline": ("mean", "greedy"), "reinforce_reward": ("sequence", "to_go")}
    assert choice_problems(root, choices) == [
        "sat_tf/model/parts.py:1 repeats the choices of --scst_baseline: ('greedy', 'mean') "
        "(config.CHOICES, config.check_choice)"
    ]


def _test_classes():
    """(`tests/<file>::<class>`, its `ast.ClassDef`) of every class in the test files."""
    for name in sorted(os.listdir(os.path.join(ROOT, "tests"))):
        if not name.endswith("_test.py"):
            continue
        with open(os.path.join(ROOT, "tests", name), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                yield f"tests/{name}::{node.name}", node


def _classes_calling(function):
    """The test classes that call `function` by name."""
    return {
        scope
        for scope, node in _test_classes()
        if any(
            isinstance(n, ast.Call) and getattr(n.func, "id", None) == function
            for n in ast.walk(node)
        )
    }


def _marks(node, marker):
    """The arguments of each `@pytest.mark.<marker>(...)` on a class, as literals."""
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", None) == marker:
            yield tuple(ast.literal_eval(a) for a in decorator.args)


def _marked(marker):
    """{class: its `marker`'s first argument} of the test classes that carry it."""
    return {scope: args[0] for scope, node in _test_classes() for args in _marks(node, marker)}


def test_scope_groups_are_the_classes_that_share_their_function():
    # conftest.py sends each group to one pytest-xdist worker; a class that starts
    # calling the shared function, or stops, gains or loses the marker.
    groups = _marked("scope_group")
    assert set(groups.values()) == {"trained_run", "exports"}
    for group in set(groups.values()):
        assert {s for s, g in groups.items() if g == group} == _classes_calling(group), group


def test_the_long_classes_have_one_rank_a_scope():
    # The classes of a scope group share its rank; other ranks are each one class's.
    ranks, groups = _marked("long"), _marked("scope_group")
    assert set(groups) <= set(ranks)
    scopes = {groups.get(scope, scope): rank for scope, rank in ranks.items()}
    assert len(set(scopes.values())) == len(scopes), scopes
    for scope, rank in ranks.items():
        assert scopes[groups.get(scope, scope)] == rank, scope
