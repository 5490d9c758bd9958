"""Tests for docs/design.md: its sections are numbered in order, every citation of it in
the repository (`docs/design.md §N` or `§N.M`) names a section it has, and no citation
of a design file that the repository does not hold remains."""

import os
import re
import subprocess

from absl.testing import absltest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DESIGN = os.path.join("docs", "design.md")
# Larger files are data, not text that cites the page.
MAX_TEXT_BYTES = 4 * 1024**2
BINARY_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".npz", ".h5", ".pb", ".tflite", ".gz")

SECTION = re.compile(r"^(##|###) (\d+)\.(\d+)?\s")
# A citation: the file's path, then one section, or several ("§4.2, §6.2").
CITATION = re.compile(r"docs/design\.md((?:,?\s*§\s*\d+(?:\.\d+)*)+)")
NUMBER = re.compile(r"§\s*(\d+(?:\.\d+)*)")
# A bare § inside design.md is one of its own sections unless "paper" comes first.
OWN_REFERENCE = re.compile(r"(?<!paper )((?:§\s*\d+(?:\.\d+)*(?:,\s*)?)+)")
# The design file that lived outside the repository, with or without its extension.
OUTSIDE = re.compile(r"\bDESIGN(\.md\b|\s*§)")
# The file name and a § without the folder, docs/, do not say which file is meant.
UNROOTED = re.compile(r"(?<![\w/])design\.md\s*§")


def sections(text):
    """The section numbers of a design page ("4", "4.2", ...), in order of appearance.

    Raises:
      ValueError: for a heading whose level does not fit its number.
    """
    found = []
    for line in text.splitlines():
        match = SECTION.match(line)
        if not match:
            continue
        level, major, minor = match.groups()
        if (level == "##") != (minor is None):
            raise ValueError(f"heading {line!r}: '##' takes 'N.', '###' takes 'N.M'")
        found.append(major if minor is None else f"{major}.{minor}")
    return found


def numbering_problems(numbers):
    """Where `numbers` (from `sections`) break 1, 1.1, 1.2, 2, 2.1, ... order."""
    problems, major, minor = [], 0, 0
    for number in numbers:
        parts = [int(p) for p in number.split(".")]
        if len(parts) == 1:
            want = f"{major + 1}"
            major, minor = parts[0], 0
        else:
            want = f"{major}.{minor + 1}"
            minor = parts[1]
            if parts[0] != major:
                major = parts[0]
        if number != want:
            problems.append(f"§{number} where §{want} comes next")
    return problems


def citation_problems(name, text, known):
    """Citations in `text` (the contents of file `name`) that name no section of
    `known`, and citations of a design file outside the repository; each as
    `name:line: what`."""
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        for citation in CITATION.finditer(line):
            for cited in NUMBER.findall(citation.group(1)):
                if cited not in known:
                    problems.append(f"{name}:{number}: docs/design.md has no §{cited}")
        if OUTSIDE.search(line):
            problems.append(f"{name}:{number}: cites a design file outside the repository")
        if UNROOTED.search(line):
            problems.append(f"{name}:{number}: cites design.md without its folder, docs/")
    return problems


def own_reference_problems(text, known):
    """Bare § references inside design.md that name none of its sections."""
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        if SECTION.match(line):
            continue
        for group in OWN_REFERENCE.findall(line):
            for cited in NUMBER.findall(group):
                if cited not in known:
                    problems.append(f"{DESIGN}:{number}: §{cited} is not a section")
    return problems


def repository_files():
    """The repository's files (relative paths): git's list, or a walk of the tree
    without hidden folders where git cannot tell."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode("utf-8")
        return [p for p in listed.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        found = []
        for folder, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            found += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names]
        return found


def read_text(path):
    """The file's text, or None for a binary, unreadable or very large file."""
    full = os.path.join(ROOT, path)
    if path.lower().endswith(BINARY_SUFFIXES) or not os.path.isfile(full):
        return None
    if os.path.getsize(full) > MAX_TEXT_BYTES:
        return None
    try:
        with open(full, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    return None if "\0" in text else text


def design_text():
    with open(os.path.join(ROOT, DESIGN), encoding="utf-8") as f:
        return f.read()


class DesignPageTest(absltest.TestCase):
    def test_sections_are_numbered_in_order(self):
        numbers = sections(design_text())
        self.assertGreaterEqual(len([n for n in numbers if "." not in n]), 5)
        self.assertEqual(numbering_problems(numbers), [])
        self.assertEqual(len(numbers), len(set(numbers)))

    def test_own_references_name_its_sections(self):
        text = design_text()
        self.assertEqual(own_reference_problems(text, set(sections(text))), [])

    def test_every_citation_in_the_repository_names_a_section(self):
        known = set(sections(design_text()))
        problems, cited = [], 0
        for path in repository_files():
            text = read_text(path)
            if text is None:
                continue
            problems += citation_problems(path, text, known)
            if path != DESIGN:
                cited += len(CITATION.findall(text))
        self.assertEqual(problems, [], "\n".join(problems))
        # The code cites the page in several places; none found means the scan is broken.
        self.assertGreaterEqual(cited, 5)


class CheckerTest(absltest.TestCase):
    """The checks above find what they are meant to find."""

    def test_sections_and_numbering(self):
        text = "# t\n## 1. A\n### 1.1 a\n### 1.2 b\n## 2. B\n### 2.1 c\n## 4. D\n"
        self.assertEqual(sections(text), ["1", "1.1", "1.2", "2", "2.1", "4"])
        self.assertEqual(numbering_problems(sections(text)), ["§4 where §3 comes next"])
        self.assertEqual(numbering_problems(["1", "1.2"]), ["§1.2 where §1.1 comes next"])
        self.assertEqual(
            numbering_problems(["1", "1.1", "2", "1.2"]), ["§1.2 where §2.1 comes next"]
        )
        with self.assertRaisesRegex(ValueError, "'###' takes 'N.M'"):
            sections("### 3. wrong level\n")

    def test_citations(self):
        known = {"1", "4", "4.2", "6.2"}
        path = "docs/design.md"
        text = "\n".join(
            [
                f"ok ({path} §4.2), several ({path} §4.2, §6.2), a whole section: {path} §1",
                f"missing: {path} §4.3 and ({path} §4.2, §9)",
                "old: " + "DESIGN" + ".md §2, and (" + "DESIGN" + " §1)",
                "unrooted: design" + ".md §4",
                f"too deep: {path} §4.2.1",
                "paper §4.1 and a bare §7 are not citations of the page",
            ]
        )
        self.assertEqual(
            citation_problems("f.py", text, known),
            [
                "f.py:2: docs/design.md has no §4.3",
                "f.py:2: docs/design.md has no §9",
                "f.py:3: cites a design file outside the repository",
                "f.py:4: cites design.md without its folder, docs/",
                "f.py:5: docs/design.md has no §4.2.1",
            ],
        )

    def test_own_references(self):
        text = "## 1. A\nsee §1 and §2.1, paper §4.2.1 and (§1, §3)\n"
        self.assertEqual(
            own_reference_problems(text, {"1"}),
            [f"{DESIGN}:2: §2.1 is not a section", f"{DESIGN}:2: §3 is not a section"],
        )


if __name__ == "__main__":
    absltest.main()
