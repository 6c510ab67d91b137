"""Every command README.md shows still runs as shown; the README stays short and leads to every page.

Which commands: every fenced code block of README.md whose info string is `bash`, `sh` or `console`.
- In `bash` and `sh` blocks every line is a command, except blank lines and lines starting with `#`;
  a line ending in a backslash continues on the next one.
- In `console` blocks only lines starting with `$ ` are commands (`$ ` dropped); the rest is output.
- A command is split as the shell would (shlex, comments on), so a trailing `# ...` is not part of it;
  leading `NAME=value` words are environment variables for it.
- A fenced `yaml` block whose first line is `# NAME.yaml` is the file NAME.yaml the commands use; it is
  written, as shown, into the directory where they run.
Blocks without one of those info strings (program output) are not commands.

What each command must do here, decided by its first words:
- `bash scripts/NAME.sh ...` (the two commands of a fresh machine): the script exists and `bash -n`
  parses it. Running them here would install packages, or run this suite inside itself; what they run
  is checked elsewhere: the main job on the embedded default by tests/test_default_run.py (a real
  default run through the CLI, marked slow; checked below to still do that), the suite by CI.
- `supertune train ...` trains, so it is dry-run: `supertune config show` with the same config and
  overrides resolves and checks the config train would run (`--nproc N` becomes `launch.nproc=N`;
  `--run-dir DIR` and `--no-resume` are train's own and dropped).
- `supertune ... --help`, `supertune config ...`, `supertune clusters ...`, `supertune env`, and
  `supertune submit|sweep ... --dry-run` run as shown: offline, under a second or two each.
- Anything else fails: a command the README shows in a code block must be checkable here; show it in
  a table (as text) instead, or teach this test how to dry-run it.
Each runs in a fresh temporary directory holding the README's files, with this checkout's supertune
(`python -m supertune`), offline, the tester's own cluster profiles hidden, and must exit 0.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MAX_README_BYTES = 12_000
COMMAND_BLOCKS = ("bash", "sh", "console")
ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)

# Allowed: a link to a page another change is writing. Remove an entry once its page exists.
PAGES_BEING_WRITTEN: set[str] = set()


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced code block, in order."""
    return [(m.group(1).lower(), m.group(2)) for m in FENCE.finditer(text)]


def shown_files(text: str) -> dict[str, str]:
    """The `yaml` blocks that start with `# NAME.yaml`: file name -> content."""
    files = {}
    for info, body in fenced_blocks(text):
        first = body.splitlines()[0] if body.strip() else ""
        m = re.match(r"#\s*([\w.-]+\.ya?ml)\b", first)
        if info in ("yaml", "yml") and m:
            files[m.group(1)] = body
    return files


def shown_commands(text: str) -> list[str]:
    """Every command line of the bash, sh and console blocks, by the rule in the module docstring."""
    commands = []
    for info, body in fenced_blocks(text):
        if info not in COMMAND_BLOCKS:
            continue
        pending = ""
        for raw in body.splitlines():
            line = raw.strip()
            if info == "console":
                if not line.startswith("$ ") and not pending:
                    continue
                line = line.removeprefix("$ ")
            if not pending and (not line or line.startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            commands.append(pending + line)
            pending = ""
        assert not pending, f"a README command ends in a backslash with nothing after it: {pending!r}"
    return commands


def split_command(command: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(command, comments=True)
    env = {}
    while words and ENV_WORD.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def train_as_config_show(args: list[str]) -> list[str]:
    """`train ARGS` -> `config show ARGS'`: the same config and overrides, resolved without training."""
    out, rest = ["config", "show"], iter(args)
    for word in rest:
        if word == "--run-dir":
            next(rest)
        elif word.startswith("--run-dir=") or word == "--no-resume":
            continue
        elif word == "--nproc":
            out.append(f"launch.nproc={next(rest)}")
        elif word.startswith("--nproc="):
            out.append(f"launch.nproc={word.split('=', 1)[1]}")
        else:
            out.append(word)
    return out


def plan(words: list[str]) -> tuple[str, list[str]]:
    """What to do with one README command: ('script', [path]) or ('supertune', argv after `supertune`)."""
    if words[:1] == ["bash"] and len(words) >= 2 and words[1].startswith("scripts/"):
        return "script", [words[1]]
    assert words[:1] == ["supertune"], f"the README shows a command this test cannot check: {shlex.join(words)}"
    args = words[1:]
    if "--help" in args or "-h" in args or args in (["--version"], ["env"]):
        return "supertune", args
    if args[:1] == ["train"]:
        return "supertune", train_as_config_show(args[1:])
    if args[:1] in (["config"], ["clusters"]):
        return "supertune", args
    if args[:1] in (["submit"], ["sweep"]) and "--dry-run" in args:
        return "supertune", args
    raise AssertionError(
        f"the README shows `{shlex.join(words)}` in a code block, which this test can neither run here nor "
        "dry-run: show it in a table instead, or add its dry-run form to tests/test_readme_commands.py"
    )


README_TEXT = README.read_text(encoding="utf-8")
COMMANDS = shown_commands(README_TEXT)


def _shown(command: str) -> str:
    """The command without its comment, as a test id and for comparisons."""
    return shlex.join(shlex.split(command, comments=True))


def test_the_readme_shows_commands():
    shown = [_shown(c) for c in COMMANDS]
    assert "bash scripts/train-default.sh" in shown, "the main job's command is gone"
    assert "bash scripts/test.sh" in shown, "the README's test command (what .ci/run runs) is gone"
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert any(c.startswith("supertune ") for c in shown)


@pytest.mark.parametrize("command", COMMANDS, ids=_shown)
def test_readme_command_runs(command, tmp_path):
    env_words, words = split_command(command)
    kind, args = plan(words)
    if kind == "script":
        script = REPO / args[0]
        assert script.is_file(), f"{command}: {args[0]} does not exist"
        parsed = subprocess.run(["bash", "-n", str(script)], check=False, capture_output=True, text=True, timeout=30)
        assert parsed.returncode == 0, f"{command}: bash -n {args[0]}:\n{parsed.stderr}"
        return
    for name, content in shown_files(README_TEXT).items():
        (tmp_path / name).write_text(content, encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **env_words}
    env["SUPERTUNE_CONFIG_DIR"] = str(tmp_path / "no-user-config")  # the tester's own cluster profiles hidden
    argv = [sys.executable, "-m", "supertune", *args]
    proc = subprocess.run(argv, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    ran = "supertune " + shlex.join(args)
    assert proc.returncode == 0, (
        f"README: `{command}` (checked as `{ran}`) exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    )


def test_the_default_run_is_run_for_real_elsewhere():
    """The README's main job is only parsed here; test_default_run.py trains it through the real CLI."""
    text = (REPO / "tests" / "test_default_run.py").read_text(encoding="utf-8")
    assert '"-m", "supertune", "train"' in text, "tests/test_default_run.py no longer runs `supertune train`"
    assert "supertune: eval loss" in text and "supertune: sample:" in text, "nor checks what the README says it prints"


def test_every_command_has_a_row():
    from supertune.cli.main import COMMANDS as SUBCOMMANDS

    rows = [line for line in README_TEXT.splitlines() if line.startswith("| `supertune ")]
    named = {re.match(r"\| `supertune ([a-z]+)", row).group(1) for row in rows}
    assert named == set(SUBCOMMANDS), (
        f"README command table: missing {sorted(set(SUBCOMMANDS) - named)}, stale {sorted(named - set(SUBCOMMANDS))}"
    )


def test_readme_is_short():
    size = len(README_TEXT.encode("utf-8"))
    assert size <= MAX_README_BYTES, (
        f"README.md is {size} bytes; at most {MAX_README_BYTES}: move the detail into docs/"
    )


def _links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", m.group(1))]


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        if m := re.match(r"#{1,6}\s+(.*)", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
    ids = set(seen)
    ids |= {f"{slug}-{n}" for slug, count in seen.items() for n in range(1, count)}
    return ids


def _target(page: Path, link: str) -> tuple[Path, str]:
    path, _, anchor = link.partition("#")
    return ((page.parent / path).resolve() if path else page), anchor


def test_readme_links_every_page():
    linked = {_target(README, link)[0] for link in _links(README)}
    pages = sorted(REPO.glob("docs/*.md")) + [REPO / "bench" / "README.md"]
    missing = [str(p.relative_to(REPO)) for p in pages if p.resolve() not in linked]
    assert not missing, f"README.md does not link: {missing}"
    tutorials_index = REPO / "docs" / "tutorials" / "README.md"
    assert tutorials_index.resolve() in linked
    indexed = {_target(tutorials_index, link)[0] for link in _links(tutorials_index)}
    unlisted = [
        p.name
        for p in sorted(tutorials_index.parent.glob("*.md"))
        if p != tutorials_index and p.resolve() not in indexed
    ]
    assert not unlisted, f"docs/tutorials/README.md does not link: {unlisted}"


@pytest.mark.parametrize(
    "page", ["README.md", "bench/README.md", *sorted(str(p.relative_to(REPO)) for p in REPO.glob("docs/**/*.md"))]
)
def test_links_lead_somewhere(page):
    source = REPO / page
    broken = []
    for link in _links(source):
        target, anchor = _target(source, link)
        if not target.exists():
            if not target.is_relative_to(REPO) or str(target.relative_to(REPO)) not in PAGES_BEING_WRITTEN:
                broken.append(link)
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(link)
    assert not broken, f"{page}: links to nothing: {broken}"


def test_the_fault_points_are_test_only_wherever_the_docs_name_them():
    """SUPERTUNE_FAULT, SUPERTUNE_FAULT_ONCE and SUPERTUNE_FAULT_IN kill a process on purpose: a page that
    names one (to say how a behaviour was tested) says that they are the suite's, and no setting."""
    pages = [p for p in sorted((REPO / "docs").rglob("*.md")) if "SUPERTUNE_FAULT" in p.read_text(encoding="utf-8")]
    assert len(pages) >= 3, pages
    unsaid = [str(p.relative_to(REPO)) for p in pages if "test-only" not in p.read_text(encoding="utf-8")]
    assert not unsaid, f"name the fault points as test-only (docs/development.md) in: {', '.join(unsaid)}"
