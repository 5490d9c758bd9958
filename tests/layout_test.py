"""The direction of imports between the folders of sat_tf/, read from the source with `ast`.

Data flows one way: `data/` (readers, vocabulary, pixels, tf.data, the feature cache's
format) imports neither the model nor anything above it; `model/` imports neither
training, inference nor the export, and what it keeps beside it (self-critical training,
the decoding rules, the location prior) imports neither the model nor training;
inference (the Python API, `inference.py`, the export, the preset format) never goes
through `training/`; the preset format reads files and never imports the model; and no
two parts of the package (a subpackage, or a module at the top) import each other,
directly or around a loop. Imports inside functions count as much as those at the top.

Sizes, in lines of code (docstrings, comments and blank lines not counted): `model/`
without its speed folder `fast/` is the paper, read top to bottom, in a few files; no
module, class or function outside `fast/` grows past what a reader holds at once.

One source for every setting: a class of the package (a dataclass's field, a NamedTuple's,
an `__init__`'s parameter) that has a default for a `Config` setting has Config's own,
read from it (`Config.name`) or equal to it; and the allowed values of a setting
(`config.CHOICES`) are written nowhere else.
"""

import ast
import dataclasses
import inspect
import io
import os
import textwrap
import tokenize

import pytest

from sat_tf import config as config_lib
from sat_tf.config import Config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORT = "exporting"
# part -> the parts it may not import.
FORBIDDEN = {
    "data": ("model", "training", "evaluation", "inference", EXPORT),
    "model": ("training", "inference", "api", EXPORT),
    "api": ("training",),
    "inference": ("training",),
    "preset": ("training", "model"),
    EXPORT: ("training",),
    # What the project adds beyond the paper, kept beside model/: the model imports them.
    "self_critical": ("training", "model"),
    "decoding_rules": ("training", "model"),
    "location_prior": ("training", "model"),
}

# Size limits in lines of code (`code_lines`).
MODEL_FILES = 8  # sat_tf/model/*.py, fast/ not counted
MODEL_CODE_LINES = 1000
MODULE_CODE_LINES = 450
CLASS_CODE_LINES = 300
FUNCTION_CODE_LINES = 80  # outside model/fast/


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
        in_model = module.startswith("sat_tf/model/") and not module.startswith(
            "sat_tf/model/fast/"
        )
        if in_model and not inner:
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
    """`sat_tf.data.vocab` -> "data", `sat_tf.preset` -> "preset", `sat_tf` -> "sat_tf"."""
    pieces = dotted.split(".")
    return pieces[1] if len(pieces) > 1 else "sat_tf"


def import_graph(package_root):
    """{(file path relative to the package's parent, line): (importing part, imported
    module)} for every import of a sat_tf module by a file of `package_root`."""
    edges = {}
    for folder, _, names in os.walk(package_root):
        for file_name in sorted(names):
            if not file_name.endswith(".py"):
                continue
            path = os.path.join(folder, file_name)
            source = part_of(_module_name(package_root, path))
            where = os.path.relpath(path, os.path.dirname(package_root))
            for target, line in _imports(package_root, path).items():
                edges[(where, line, target)] = source
    return edges


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
    """Every import against `FORBIDDEN`, and every loop between parts, as lines."""
    problems, parts_graph, witness = [], {}, {}
    for (where, line, target), source in sorted(import_graph(package_root).items()):
        imported = part_of(target)
        if imported in FORBIDDEN.get(source, ()):
            problems.append(f"{where}:{line} imports {target}: {source} may not import {imported}")
        if imported != source:
            parts_graph.setdefault(source, set()).add(imported)
            witness.setdefault((source, imported), f"{where}:{line} imports {target}")
    for component in _cycles(parts_graph):
        links = [witness[(a, b)] for a in component for b in component if (a, b) in witness]
        problems.append(f"parts {', '.join(component)} import each other: " + "; ".join(links))
    return problems


def test_the_package_imports_one_way():
    package = os.path.join(ROOT, "sat_tf")
    assert violations(package) == []


def test_sizes_stay_within_their_limits():
    assert size_problems(os.path.join(ROOT, "sat_tf")) == []


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


def test_the_graph_sees_the_imports_that_exist():
    graph = import_graph(os.path.join(ROOT, "sat_tf"))
    parts = {(source, part_of(target)) for (_, _, target), source in graph.items()}
    # training/ is where data and model meet; the model reads the vocabulary's ids.
    assert {("training", "model"), ("training", "data"), ("model", "data")} <= parts
    assert ("training", EXPORT) not in parts
    assert {("api", "inference"), ("inference", "model"), ("training", "inference")} <= parts
    assert {("model", beside) for beside in ("self_critical", "decoding_rules")} <= parts
    assert ("model", "location_prior") in parts


def _tree(tmp_path, files):
    root = tmp_path / "sat_tf"
    for name in ("", "data", "model", "training", "evaluation"):
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
        ("api.py", "training/loop.py", "api may not import training"),
        ("inference.py", "training/loop.py", "inference may not import training"),
        ("preset.py", "model/step.py", "preset may not import model"),
        ("preset.py", "training/loop.py", "preset may not import training"),
    ],
)
def test_inference_never_goes_through_training(tmp_path, importer, imported, message):
    target = "sat_tf." + imported[: -len(".py")].replace("/", ".")
    root = _tree(tmp_path, {imported: "", importer: f"import {target}\n"})
    assert violations(root) == [f"sat_tf/{importer}:1 imports {target}: {message}"]


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
            "training/loop.py": f"from sat_tf import {EXPORT}\n",
            f"{EXPORT}.py": "from sat_tf.training import loop\n",
            "evaluation/score.py": "from sat_tf.data import vocab\n",
            "data/vocab.py": "from sat_tf.evaluation import score\n",
        },
    )
    assert violations(root) == [
        "sat_tf/data/vocab.py:1 imports sat_tf.evaluation.score: data may not import evaluation",
        f"sat_tf/{EXPORT}.py:1 imports sat_tf.training.loop: {EXPORT} may not import training",
        "parts data, evaluation import each other: sat_tf/data/vocab.py:1 imports "
        "sat_tf.evaluation.score; sat_tf/evaluation/score.py:1 imports sat_tf.data.vocab",
        f"parts {EXPORT}, training import each other: sat_tf/{EXPORT}.py:1 imports "
        f"sat_tf.training.loop; sat_tf/training/loop.py:1 imports sat_tf.{EXPORT}",
    ]


# Parameters named like a `Config` setting that hold another quantity, so that their
# defaults are not the setting's: (file, class, name) -> what they hold.
OTHER_MEANINGS = {
    ("sat_tf/api.py", "Captioner", "batch_size"): "images captioned at once",
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
    from sat_tf import exporting, self_critical
    from sat_tf.model import decoder, losses

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


def test_scope_groups_are_the_classes_that_share_their_function():
    # conftest.SCOPE_GROUPS sends each group to one pytest-xdist worker; a class that
    # starts calling the shared function, or stops, must be named there or removed.
    from conftest import SCOPE_GROUPS

    for group, (function, scopes) in SCOPE_GROUPS.items():
        assert _classes_calling(function) == set(scopes), group


def test_the_classes_run_first_exist():
    from conftest import LONGEST_FIRST

    missing = set(LONGEST_FIRST) - {scope for scope, _ in _test_classes()}
    assert not missing, missing
