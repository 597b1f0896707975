"""The docs keep up with the code: every recipe field of the JSON Schema appears in docs/recipes.md, and the
README stays a front page (what it is, install, quick start, where to go next) under 150 lines."""
from __future__ import annotations

import bisect
import contextlib
import functools
import io
import json
import re
import subprocess
import tokenize
from pathlib import Path
from typing import Any

from ctxbuild.recipes.recipe import SCHEMA_PATH

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


def _properties(node: Any, path: str = "") -> dict[str, str]:
    """field name -> where in the schema (every `properties` key, at any depth, $defs included)."""
    found: dict[str, str] = {}
    if isinstance(node, dict):
        for name, sub in (node.get("properties") or {}).items():
            found.setdefault(name, f"{path}.{name}".lstrip("."))
            found.update({k: v for k, v in _properties(sub, f"{path}.{name}").items() if k not in found})
        for key, sub in node.items():
            if key != "properties":
                found.update({k: v for k, v in _properties(sub, path).items() if k not in found})
    elif isinstance(node, list):
        for sub in node:
            found.update({k: v for k, v in _properties(sub, path).items() if k not in found})
    return found


def test_every_schema_field_is_documented() -> None:
    doc = (ROOT / "docs" / "recipes.md").read_text()
    fields = _properties(json.loads(SCHEMA_PATH.read_text()))
    assert len(fields) > 40  # the walk found the recipe's fields, not nothing
    missing = [f"{name} ({where})" for name, where in sorted(fields.items())
               if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", doc)]
    assert not missing, f"docs/recipes.md does not mention: {', '.join(missing)}"


def test_readme_is_a_front_page() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 150
    for heading in ("## Install", "## Quick start", "## Where to go next"):
        assert heading in text, heading
    assert not re.search(r"pip install\s+['\"]?ctxbuild", text)  # not on PyPI: never suggest installing it from there
    for link in re.findall(r"\]\(([^)#]+)\)", text):  # every page the front page points at exists
        assert link.startswith("http") or (ROOT / link).exists(), link


def test_every_yaml_block_in_the_docs_is_a_valid_recipe_or_defaults_file() -> None:
    """What a reader copies: each ```yaml block of the README and docs/ (recipes, fragments of one, a _defaults.yaml)
    passes the schema ctxbuild checks recipes with (a renamed or retyped field would fail the reader's build)."""
    import yaml

    from ctxbuild.recipes import recipe

    checked = 0
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S):
            data = yaml.safe_load(block)
            defaults = bool({"defaults", "target_groups", "cache", "executor"} & set(data))
            schema = recipe.schema()["$defs"]["defaults_file"] if defaults else recipe._partial_recipe_schema()
            recipe._validate(page, data, schema)  # raises RecipeError naming the field
            checked += 1
    assert checked >= 15, checked


# The word "session" in the project means an onnxruntime session (InferenceSession, its options and config entries,
# a simulator or CPU session over a graph), a Dask client's, pytest's fixture scope or a POSIX process session;
# figures say which ctxbuild commit, toolchain and machine they were measured on, never which "session" made them.
_SESSION = re.compile(r"\bsessions?\b", re.I)
# always narrative, whatever surrounds it: numbered, pointed at in time, or somebody's
_NARRATIVE = re.compile(
    r"\bsessions?\s+\d+(?:-\d+)?(?=[\s:,;)']|$)(?!\s*(?:GB|GiB|MB|KB|s|ms)\b)|"  # "session 12", "sessions 14-15"
    r"\b(?:this|that|these|those|later|earlier|previous|next|last|other|former|current|new)\s+sessions?\b|"
    r"\b(?:lead|helper|agent|maintainer|reviewer|newcomer|contributor)s?'s?\s+sessions?\b|"
    r"\b(?:during|since|until)\s+(?:a|an|the)\s+(?:\w+\s+)?session\b|"
    r"\bsessions?(?:'s?)?\s+(?:found|measured|built|fixed|added|wrote|merged|landed|tried|decided|filed|helpers?|"
    r"work|fixes|figures?|code)\b", re.I)  # a session that did work, or whose work it was
# what marks the technical meaning near an occurrence (within the sentence around it)
_TECHNICAL = re.compile(
    r"onnxruntime|InferenceSession|SessionOptions|session[._]\w|\bORT\b|\bort\b|\bEPs?\b|QNN|HTP|simulator|\bCPU\b|"
    r"genai|Dask|client|pytest|fixture|killpg|setsid|process group|signal|option|config|arena|\.run\b|\bruns?\b|"
    r"load|creat|start-?up|alive|child|graphs?\b|weights?\b|\bARs?\b|\bCLs?\b|calibrat|quantiz|mapp|twin|provider|"
    r"backend|activation", re.I)
_PROSE_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".j2", ".toml", ".txt", ".cfg", ".sh", ".html", ".ninja"}


def _project_text_files() -> list[Path]:
    try:
        names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.split()
        files = [ROOT / n for n in names]
    except (OSError, subprocess.CalledProcessError):  # not a git clone (an unpacked sdist): walk the tree
        files = [p for p in ROOT.rglob("*") if not any(part.startswith(".") or part in {"out", "build"}
                                                       for part in p.relative_to(ROOT).parts[:-1])]
    return [p for p in files if p.is_file() and (p.suffix in _PROSE_SUFFIXES or p.name == "Makefile"
                                                  or p.parent.name == ".ci")]


def _code_names(path: Path, text: str) -> set[tuple[int, int]]:
    """(line, column) of each `session`/`sessions` that is a Python identifier, not prose."""
    if path.suffix != ".py":
        return set()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return set()
    return {t.start for t in tokens if t.type == tokenize.NAME and t.string.lower() in {"session", "sessions"}}


def narrative_sessions(path: Path, text: str) -> list[str]:
    """`file:line: excerpt` for each use of the word that is not an onnxruntime/Dask/pytest/process session."""
    code = _code_names(path, text)
    line_starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
    found = []
    for m in _SESSION.finditer(text):
        line = bisect.bisect_right(line_starts, m.start())
        if (line, m.start() - line_starts[line - 1]) in code:
            continue
        before, after = text[max(0, m.start() - 200):m.start()], text[m.end():m.end() + 100]
        # the sentence around it: from the last sentence end before to the next one after
        before = re.split(r"[.;!?](?:\s|$)|\n\s*\n", before)[-1]
        after = re.split(r"[.;!?](?:\s|$)|\n\s*\n", after)[0]
        here = " ".join((before + m.group() + after).split())
        narrative = _NARRATIVE.search(" ".join(text[max(0, m.start() - 40):m.end() + 12].split()))
        if narrative or not _TECHNICAL.search(here):
            found.append(f"{path.relative_to(ROOT)}:{line}: {here[:160]}")
    return found


def test_no_session_narrative_in_the_project() -> None:
    """Nothing in the project (docs, README, tests, comments, bench, recipes) tells which session made what: the
    word is left to onnxruntime, Dask, pytest and POSIX sessions (this file names the narrative forms it refuses)."""
    files = [p for p in _project_text_files() if p != Path(__file__).resolve()]
    assert len(files) > 300, len(files)  # the walk saw the project, not nothing
    found = [hit for p in files for hit in narrative_sessions(p, p.read_text(errors="replace"))]
    assert not found, "say which commit, toolchain and machine, not which session:\n" + "\n".join(found)


def test_the_session_check_tells_narrative_from_onnxruntime() -> None:
    """The classifier on the forms it must refuse and the ones it must leave alone."""
    page = ROOT / "docs" / "x.md"
    refused = ["Measured in session 12 on SM8650.", "Decision (session 10): links.", "sessions 14-15 tried it.",
               "That was so when this session measured the graph.", "A later session should run it.",
               "the lead's session ran the simulator beside it", "Figures of the previous session.",
               "It was found during a long session.", "The session found why the graph fails on the HTP.",
               "before this session's fixes the graphs failed", "the session's helpers merged the graph code"]
    kept = ["One simulator session per action runs all samples.", "Set the session options' log severity.",
            "`session.disable_cpu_ep_fallback` keeps the graph whole.", "an onnxruntime session on the CPU EP",
            "InferenceSession and SessionOptions", "the fixture is pytest's scope=\"session\" one",
            "a Dask client session", "killpg reaches the driver in its own session",
            "sessions of one CL at a time: the graphs hold the weights"]
    for text in refused:
        assert narrative_sessions(page, text), text
    for text in kept:
        assert not narrative_sessions(page, text), text
    code = "session = ort.InferenceSession(path)\nout = session.run(None, feeds)  # one call\n"
    assert not narrative_sessions(ROOT / "x.py", code)
    assert narrative_sessions(ROOT / "x.py", "x = 1  # measured in session 9\n")


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens, -1, -2 on
    repeats."""
    seen: dict[str, int] = {}
    text = _prose(page.read_text())
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_every_relative_link_resolves() -> None:
    """Each relative link of the README and docs/ names a file that exists, and an anchor that page has."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tests" / "exports" / "README.md"]
    broken, checked = [], 0
    for page in pages:
        text = _prose(page.read_text())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            checked += 1
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading in {dest.name})")
    assert checked > 30, checked
    assert not broken, "\n".join(broken)


_ROOTS = ("ctxbuild/", "tests/", "bench/", "templates/", "recipes/", "docs/", ".ci/")
# paths a fresh clone does not have: made by builds and benchmarks
_GENERATED = ("OUT/", "bench/results/", "out/")


def _fences(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block, fences paired in order (a closing ``` never opens one)."""
    blocks, lang, body = [], None, []
    for line in text.splitlines():
        fence = re.match(r"^\s*```\s*([\w+-]*)\s*$", line)
        if fence and lang is None:
            lang, body = fence.group(1), []
        elif fence and not fence.group(1):
            blocks.append((lang, "\n".join(body) + "\n"))
            lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def _prose(text: str) -> str:
    """The page without its fenced blocks."""
    kept, inside = [], False
    for line in text.splitlines():
        if re.match(r"^\s*```", line):
            inside = not inside
        elif not inside:
            kept.append(line)
    return "\n".join(kept)


_PATH_LIKE = r"\.?[a-z_][\w.-]*(?:/[\w.-]+)*/?"


def _diagram_paths(text: str) -> set[str]:
    """In plain code blocks (the diagrams; ```python blocks are code, not paths) every token with a slash or a
    file suffix; a line starting with `dir/` lists what is in it, up to the next such line."""
    names: set[str] = set()
    for lang, block in _fences(text):
        if lang:
            continue
        under = ""
        for line in block.splitlines():
            tokens = re.findall(rf"(?<![\w./<-])({_PATH_LIKE})(?![\w/<])", line)
            if tokens and re.match(rf"{re.escape(tokens[0])}\s{{2,}}", line) and tokens[0].endswith("/"):
                under, tokens = tokens[0], tokens[1:]
                names.add(under)
            names.update(t if t.startswith(_ROOTS) else under + t for t in tokens
                         if "/" in t or re.search(r"\.(py|j2)$", t))
    return {n for n in names if not n.startswith(_GENERATED)}


def _prose_paths(prose: str) -> set[str]:
    """Backticked tokens with a slash or a file suffix, and bare ones under a top-level directory or ending in .py."""
    names = {tick for tick in re.findall(r"`([^`\s]+)`", prose) if re.fullmatch(_PATH_LIKE, tick)
             and ("/" in tick.rstrip("/") or re.search(r"\.(py|j2)$", tick))}
    names.update(re.findall(r"(?<![\w./`-])((?:ctxbuild|tests|bench|templates|recipes|docs|\.ci)/[\w./-]*[\w/]"
                            r"|[a-z_]\w*\.py)(?![\w`])", prose))
    return {n.rstrip(".") for n in names if not n.startswith(_GENERATED)}


def _exists(name: str, near: frozenset[str] | set[str] = frozenset()) -> bool:
    """A path from the project's root or from ctxbuild/ (`graph/cut.py`, `engine/`, a base module `errors.py`); a
    bare file name only in a directory the same paragraph names (`base.py` beside `ctxbuild/plan/kinds/`): alone,
    `plan.py` would be ambiguous."""
    if name.startswith(_ROOTS):
        return (ROOT / name).exists()
    if (ROOT / name).exists() or (ROOT / "ctxbuild" / name).exists():
        return True
    return "/" not in name.rstrip("/") and any((base / d / name).exists() for d in near
                                               for base in (ROOT, ROOT / "ctxbuild"))


def _missing_paths(text: str) -> list[str]:
    """What a page names that the tree does not have, each prose paragraph read with the directories it names."""
    missing = {n for n in _diagram_paths(text) if not _exists(n)}
    for paragraph in re.split(r"\n\s*\n", _prose(text)):
        names = _prose_paths(paragraph)
        near = {n if n.endswith("/") else n.rsplit("/", 1)[0] + "/" for n in names if "/" in n}
        missing.update(n for n in names if not _exists(n, near))
    return sorted(missing)


def _layout_modules(text: str) -> list[str]:
    """Module paths the Layout table names: each package row's 'owns' items, their first word."""
    found = []
    for package, owns in re.findall(r"^\|\s*(?:base|\d+)\s*\|\s*`([^`]+)`\s*\|(.*)\|\s*$", text, re.M):
        while re.search(r"\([^()]*\)", owns):
            owns = re.sub(r"\([^()]*\)", "", owns)
        base = "ctxbuild/" if package == "ctxbuild/*.py" else f"ctxbuild/{package.rstrip('/')}/"
        for item in re.split(r"[,+]", owns):
            word = re.fullmatch(r"\s*([a-z_]\w*/?)\s*", item)  # a module or package name, not prose
            if word:
                found.append(base + word.group(1) if word.group(1).endswith("/") else f"{base}{word.group(1)}.py")
    return found


def test_internals_names_files_that_exist() -> None:
    """docs/internals.md as a map of the tree: every file, directory and module it names is there."""
    text = (ROOT / "docs" / "internals.md").read_text()
    named, modules = _diagram_paths(text) | _prose_paths(_prose(text)), _layout_modules(text)
    assert len(named) > 40 and len(modules) > 100, (len(named), len(modules))  # the parse saw the page
    missing = _missing_paths(text) + [m for m in modules if not (ROOT / m).exists()]
    assert not missing, f"docs/internals.md names what the tree does not have: {', '.join(missing)}"


def test_the_internals_check_sees_a_missing_file() -> None:
    page = ("Then plan.py creates edges; see `cli/cache.py` and ctxbuild/engine/run/runner.py.\n"
            "| 1 | `cache/` | store (the protocol), nosuchmodule, local |\n")
    assert {"plan.py", "cli/cache.py", "ctxbuild/engine/run/runner.py"} <= _prose_paths(page)
    assert _missing_paths(page) == ["cli/cache.py", "plan.py"]
    assert _missing_paths("`ctxbuild/plan/kinds/` holds `base.py`; `llm_quantize.py` beside `actions/quantize.py`.") == []
    assert [m for m in _layout_modules(page) if not (ROOT / m).exists()] == ["ctxbuild/cache/nosuchmodule.py"]


@functools.cache
def _help(*command: str) -> str:
    """`ctxbuild COMMAND --help` as a user sees it."""
    from ctxbuild.cli.main import parser

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parser().parse_args([*command, "--help"])
    return out.getvalue()


def _options(help_text: str) -> dict[str, str]:
    """option string (every alias) or positional name -> its help text, whitespace joined."""
    entries: list[tuple[list[str], str]] = []
    for line in help_text.splitlines():
        head = re.match(r"^  (\S.*?)(?:\s{2,}(.*))?$", line)
        if head and not line.startswith("   "):
            names = re.findall(r"(?:^|, )(--?[a-zA-Z][\w-]*|[A-Z]+|\{[\w,]+\})", head.group(1))
            entries.append((names, head.group(2) or ""))
        elif line.startswith("   ") and entries:
            entries[-1] = (entries[-1][0], f"{entries[-1][1]} {line.strip()}")
        elif not line.strip() or not line.startswith(" "):
            entries.append(([], ""))
    return {n: " ".join(text.split()) for names, text in entries for n in names}


_PUBLIC = ("build", "verify", "inspect", "wrap", "check", "toolchain", "plan", "targets", "clean", "schema", "cache",
           "completion")
_COMMON = {"-h", "--help", "-C", "-v", "--verbose", "-q", "--quiet"}


def _doc_command_lines() -> list[tuple[str, str, str]]:
    """(page, command, the rest of the line) for each `ctxbuild COMMAND ...` of the README and docs/, in code blocks
    and backticks."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        spans = [line for _, block in _fences(text) for line in block.splitlines()]
        spans += re.findall(r"`([^`\n]+)`", _prose(text))
        for span in spans:
            for m in re.finditer(r"(?<![\w/.-])ctxbuild(?:\s+-C\s+\S+|\s+-[vq])*\s+([a-z][a-z-]*)\b([^`#\n]*)", span):
                if m.group(1) in _PUBLIC:
                    found.append((page.name, m.group(1), m.group(2)))
    return found


def test_every_documented_command_line_uses_real_options() -> None:
    """Each option a `ctxbuild COMMAND ...` line of the docs gives is one that command's --help lists."""
    lines = _doc_command_lines()
    assert len(lines) > 40, len(lines)
    wrong = []
    for page, command, rest in lines:
        choices = re.search(r"\{([\w,]+)\}", _help(command))  # cache {stats,gc,clear}: each has its options
        subs = [w for w in re.split(r"[|\s]+", rest) if choices and w in choices.group(1).split(",")]
        helps = [_help(command, s) for s in subs] or [_help(command)]
        known = _COMMON.union(*(_options(h) for h in helps))
        for option in re.findall(r"(?<![\w/.=:-])(--?[a-zA-Z][\w-]*)", rest):
            option = re.sub(r"^(-[a-zA-Z])\d+$", r"\1", option)  # -j2 is -j 2
            if option not in known:
                wrong.append(f"{page}: ctxbuild {command} ... {option}")
    assert not wrong, "options the command does not have:\n" + "\n".join(wrong)


def test_the_command_line_synopsis_lists_every_option() -> None:
    """docs/outputs-and-cli.md's synopsis names every public command and, for each, every option its --help has."""
    text = (ROOT / "docs" / "outputs-and-cli.md").read_text()
    [synopsis] = [b for _, b in _fences(text) if b.startswith("ctxbuild [-C DIR]")]
    missing = []
    for command in _PUBLIC:
        listed = "\n".join(line for line in synopsis.split("\nctxbuild ") if line.startswith(command + " ")
                           or line == command or line.startswith(command + "\n"))
        if not listed:
            missing.append(command)
            continue
        choices = re.search(r"\{([\w,]+)\}", _help(command))
        helps = [_help(command)] + ([_help(command, c) for c in choices.group(1).split(",")] if choices else [])
        first = {o for h in helps for m in re.finditer(r"^  (-\S.*?)(?:\s{2,}|$)", h, re.M)
                 for o in re.findall(r"(?:^|, )(--?[a-zA-Z][\w-]*)", m.group(1))}
        missing += [f"{command} {o}" for o in sorted(first - _COMMON)
                    if not any(a in listed for a in _aliases(helps, o))]
    assert not missing, f"the synopsis lacks: {', '.join(missing)}"


def _aliases(helps: list[str], option: str) -> set[str]:
    """`-o` and `--out` are one option: either in the synopsis is enough."""
    for h in helps:
        for m in re.finditer(r"^  (-\S.*?)(?:\s{2,}|$)", h, re.M):
            names = re.findall(r"(?:^|, )(--?[a-zA-Z][\w-]*)", m.group(1))
            if option in names:
                return set(names)
    return {option}


def test_documented_defaults_are_the_parser_defaults() -> None:
    """docs/outputs-and-cli.md's 'PATHS defaults to `recipes`, `-o` to `out`, `-k` to `0`' against `build --help`."""
    text = " ".join((ROOT / "docs" / "outputs-and-cli.md").read_text().split())
    [sentence] = re.findall(r"PATHS defaults to [^.]*\.", text)
    pairs = re.findall(r"(PATHS|`-[\w-]+`) (?:defaults )?to `([^`]+)`", sentence)
    assert {p for p, _ in pairs} >= {"PATHS", "`-o`", "`-k`"}, pairs
    options = _options(_help("build"))
    for name, value in pairs:
        said = re.search(r"default:? ([^;,)\s]+)", options[name.strip("`")])
        assert said and said.group(1) == value, (name, value, options[name.strip("`")])


def test_make_targets_take_the_time_the_makefile_says() -> None:
    """The README's `make unit` / `make test` durations are the Makefile's own comments' (they once said 'about a
    minute' and 'seconds' for one 102 s target)."""
    readme, makefile = (ROOT / "README.md").read_text(), (ROOT / "Makefile").read_text()
    duration = r"(about \d+ s|under \d+ minutes)"
    for target in ("unit", "test"):
        [said] = re.findall(rf"^make {target}\s+#.*?{duration}", readme, re.M)
        comment = re.search(rf"((?:^#.*\n)+)(?:\S.*\n)*?{target}:", makefile, re.M)
        assert comment and said in " ".join(comment.group(1).replace("#", " ").split()), (target, said)


def test_pages_with_figures_say_where_they_were_measured() -> None:
    """A page that gives measured times, sizes or accuracies names the machine and the toolchain they are from."""
    figure = re.compile(r"\b\d+(?:\.\d+)? ?(?:s|ms|GiB|MiB|GB|MB|dB)\b")
    unsaid = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        if re.search(r"\bmeasured\b", text, re.I) and len(figure.findall(text)) >= 3:
            if not ("2 cores" in text and re.search(r"onnxruntime-qnn \d+\.\d+\.\d+", text)):
                unsaid.append(page.name)
    assert not unsaid, f"say the machine (2 cores) and toolchain (onnxruntime-qnn X.Y.Z) of the figures in: {unsaid}"
