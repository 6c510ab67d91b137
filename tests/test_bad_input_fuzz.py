"""Generated bad input, hundreds of cases, through the real CLI in this process: configs, overrides,
data files and damaged models into `config show`, `submit --dry-run`, `train` (which must stop at
validation for every config that `config show` refused), `eval` and `generate`.

Every case must end with exit code 0 or 2, never an exception, and every error line must name its
subject (a config key, an override, a file, a command-line option) before its colon. The generator
is seeded: a failure names its case and replays the same way.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest
import yaml

from average_models import save_model
from supertune.checkpoints.manifest import write_model_manifest
from supertune.cli.main import main
from supertune.resolve.layers import leaf_keys

# What an error line starts with: a dotted key (model.lora.r, training.seed), an override or a file
# named by its kind, a command-line option, or the MODEL argument.
SUBJECT = re.compile(
    r"^(override ['\"]|config file ['\"]|cluster profile |data: cannot read |MODEL[ :]|--[a-z-]+: |"
    r"[A-Za-z_][\w-]*(\.[\w-]+|\[\d+\])*(: | at line \d+))"
)

NASTY = [
    "", "-1", "0", "1e999", "-1e999", ".nan", "nan", "inf", "-.inf", "9" * 25, "9" * 400, "1:00", "12:00:00", "0x1F", "0o17",
    "yes", "off", "~", "null", "[", "]", "{", "{a: 1}", "[1, 2]", "[[[[[[]]]]]]", "[" * 60 + "]" * 60, "&a [*a]", "*undefined",
    "'quoted", '"x', "a\\b", "a/b", "..", "\udcff", "x" * 5000, "{text:>{w}}", "{text!r}", "{0}", "{}", "é" * 300, "-", "--",
    "2e-3", "1.5", "true", "1_000", "2001-12-14", "!!binary aGVsbG8=", "!!python/object:os.system", "? a", "a: b: c", "\t",
    "key=value", "a=1,b", "num_hidden_layers=-2", "hidden_size=0", "=", "%", "@", "|", ">",
]  # fmt: skip


def run(capsys, argv: list[str]) -> tuple[int, str]:
    """Exit code and stderr of one command; an exception escaping main fails the test with the case."""
    try:
        code = main(argv)
    except BaseException as exc:  # noqa: BLE001 - the case must be in the failure message
        raise AssertionError(f"{argv!r:.300} raised {type(exc).__name__}: {exc!s:.300}") from exc
    _, err = capsys.readouterr()
    assert "Traceback" not in err, f"{argv!r:.300}\n{err}"
    assert code in (0, 2), f"{argv!r:.300} exited {code}\n{err[-2000:]}"
    if code == 2:
        for problem in problems(err):
            assert SUBJECT.match(problem), f"{argv!r:.300}: the error names no subject: {problem[:300]!r}"
    return code, err


def problems(err: str) -> list[str]:
    lines = err.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("supertune: error: "))
    head = lines[first].removeprefix("supertune: error: ")
    listed = [line.removeprefix("  - ") for line in lines[first + 1 :] if line.startswith("  - ")]
    return listed if re.match(r"^\d+ problems in the config:$", head) else [head]


def overrides(rng: random.Random, keys: list[str]) -> list[str]:
    out = []
    for _ in range(rng.randint(1, 4)):
        key = rng.choice(keys + ["training", "model.lora", "nosuch.key", "data.train_files", "model.config_overrides"])
        value = rng.choice(NASTY)
        if rng.random() < 0.2:
            key = key + rng.choice([".x", "..", "", "=", " "])
        out.append(f"{key}={value}")
    return out


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    os.mkfifo(root / "fifo.txt")
    (root / "dir.txt").mkdir()
    return root


def test_generated_overrides_through_config_show_and_train(capsys, fuzz_dir):
    """300 override sets into `config show`; each one refused there must stop `train` at validation,
    with the same problems and no run directory."""
    rng = random.Random(1701)
    keys = leaf_keys() + [f"data.train_files={fuzz_dir}/fifo.txt", f"data.train_files={fuzz_dir}/dir.txt"]
    refused = 0
    for i in range(300):
        argv = overrides(rng, keys)
        code, err = run(capsys, ["config", "show", *argv])
        if code == 2 and i % 3 == 0:
            root = fuzz_dir / f"runs-{i}"
            code_train, err_train = run(capsys, ["train", *argv, f"output.runs_root={root}"])
            assert code_train == 2 and problems(err_train) == problems(err), argv
            assert not root.exists(), argv
        refused += code == 2
    assert refused > 200  # the generator makes mostly bad input


def _random_config(rng: random.Random) -> dict:
    config: dict = {}
    for key in rng.sample(leaf_keys(), 6):
        *sections, name = key.split(".")
        node = config
        for s in sections:
            node = node.setdefault(s, {})
        node[name] = rng.choice(
            [
                rng.choice(NASTY),
                rng.randint(-(2**70), 2**70),
                float(f"{rng.random():.6f}e{rng.randint(-400, 400)}"),  # fixed digits: no exponent of its own
                None,
                [],
                {},
            ]
        )
    return config


def _mutated(rng: random.Random, text: str) -> str:
    lines = text.splitlines()
    kind = rng.randrange(7)
    if kind == 0 and lines:  # a line given twice
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
    elif kind == 1:  # an unquoted YAML 1.1 value
        lines.append(rng.choice(["slurm:\n  time: 1:30", "on: 1", "training:\n  seed: 0x10", "output:\n  name: yes"]))
    elif kind == 2:  # aliases, nested or looping
        lines.append(
            "model:\n  config_overrides: &a\n    loop: *a" if rng.random() < 0.5 else "x: &b [1, 2]\ny: [*b, *b, *b]"
        )
    elif kind == 3:  # cut anywhere
        return text[: rng.randrange(len(text) + 1)]
    elif kind == 4:  # deep
        lines.append("data:\n  train_files: " + "[" * rng.randint(30, 300) + "]" * rng.randint(0, 300))
    elif kind == 5:  # tabs and stray characters
        return text.replace("  ", "\t", rng.randint(1, 3)) + rng.choice(["%", "@x", "- a", "? b", "!!"])
    return "\n".join(lines) + "\n"


def test_generated_yaml_files_through_config_show(capsys, fuzz_dir):
    rng = random.Random(42)
    for i in range(150):
        text = yaml.safe_dump(_random_config(rng), allow_unicode=True)
        path = fuzz_dir / f"c{i}.yaml"
        path.write_text(_mutated(rng, text), encoding="utf-8")
        run(capsys, ["config", "show", str(path)])


def test_generated_overrides_through_submit_dry_run(capsys, fuzz_dir):
    rng = random.Random(7)
    keys = [k for k in leaf_keys() if k.startswith(("slurm.", "launch.", "output.", "distributed."))]
    for i in range(60):
        argv = [
            "submit",
            "--cluster",
            rng.choice(["local", "leonardo", "lumi"]),
            "--dry-run",
            *overrides(rng, keys),
            f"output.runs_root={fuzz_dir}/submit-{i}",
        ]
        run(capsys, argv)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = save_model(tmp_path_factory.mktemp("model") / "model", seed=0)
    write_model_manifest(path)
    return path


def _data_file(rng: random.Random, root: Path, i: int) -> Path:
    ext = rng.choice([".txt", ".jsonl", ".json", ".csv", ".parquet"])
    path = root / f"data{i}{ext}"
    kind = rng.randrange(6)
    if kind == 0:
        path.write_bytes(rng.randbytes(rng.randint(0, 4000)))
    elif kind == 1:
        path.write_text("")
    elif kind == 2:
        rows = [
            {rng.choice(["text", "body", "t"]): rng.choice([rng.choice(NASTY), 5, None, ["a"], {"b": 1}])}
            for _ in range(20)
        ]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows)[: rng.randint(1, 2000)])
    elif kind == 3:
        path.write_bytes(b"text\n" + b"\xff\xfe bad utf-8 \x80\n" * 5)
    elif kind == 4:
        path.write_text('text,other\n"unclosed,1\nplain,2\n')
    else:
        path.write_text(" ".join(f"w0x{rng.randrange(92)}" for _ in range(rng.randint(1, 5000))) + "\n")
    return path


def test_generated_data_files_through_eval(capsys, model, fuzz_dir):
    rng = random.Random(3)
    for i in range(25):
        path = _data_file(rng, fuzz_dir, i)
        run(capsys, ["eval", str(model), "--data", str(path), "data.block_size=16", "--verify", "size"])


def _damaged_copy(rng: random.Random, model: Path, root: Path) -> Path:
    copy = root
    copy.mkdir()
    for f in model.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    if rng.random() < 0.3:
        (copy / "supertune-model.json").unlink()
    target = copy / rng.choice(sorted(p.name for p in copy.iterdir()))
    data = target.read_bytes()
    kind = rng.randrange(5)
    if kind == 0:
        target.write_bytes(data[: rng.randrange(len(data) + 1)])
    elif kind == 1 and data:
        i = rng.randrange(len(data))
        target.write_bytes(data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :])
    elif kind == 2:
        target.write_bytes(rng.randbytes(rng.randint(0, 300)))
    elif kind == 3:
        target.unlink()
    else:
        config = json.loads((copy / "config.json").read_text())
        key = rng.choice(
            [
                "vocab_size",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "max_position_embeddings",
                "intermediate_size",
            ]
        )
        config[key] = rng.choice([-2, 0, 3, "two", None, 10**30, 1.5, True])
        (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_damaged_models_through_generate_and_eval(capsys, model, fuzz_dir):
    rng = random.Random(11)
    text = fuzz_dir / "valid.txt"
    text.write_text(" ".join(f"w0x{i % 92}" for i in range(400)) + "\n")
    for i in range(30):
        copy = _damaged_copy(rng, model, fuzz_dir / f"model{i}")
        run(capsys, ["generate", str(copy), "--max-new-tokens", "2"])
        run(capsys, ["eval", str(copy), "--data", str(text), "data.block_size=16"])
