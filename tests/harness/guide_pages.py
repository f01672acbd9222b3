"""The commands of a documentation page, run as a reader would run them (docs/guides/*.md).

Each ```bash block of a page carries a marker on the line before it:
``<!-- guide-test: run -->`` (run, must exit 0), ``<!-- guide-test: background -->`` (a
long-running command, such as ``milvus-cdc serve``, started and stopped at the end) or
``<!-- guide-test: skip (why) -->``. A block of ``export NAME=value`` lines is the page's
settings: the test gives its own values for exactly those names (a renamed one fails), and every
other block runs with them in its environment. A test walks the blocks in order with
:meth:`Guide.next`, doing its own checks between them, and ends with :meth:`Guide.done`, which
fails if a block was left unrun: what the page shows is what the test ran.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from harness.installed import daemon_command
from harness.services import stop_process

MARKER = re.compile(r"<!-- guide-test: (run|background|skip)\b[^>]*-->\s*\n```bash\n(.*?)```", re.S)


@dataclass(frozen=True)
class Block:
    kind: str
    code: str
    line: int

    def exported(self) -> list[str] | None:
        """The names a settings block exports; None for any other block."""
        names: list[str] = []
        for line in self.code.splitlines():
            if line.strip() and not line.lstrip().startswith(("export ", "#")):
                return None
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if words[0] != "export":
                return None
            names += [w.split("=", 1)[0] for w in words[1:]]
        return names


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = [
        Block(m.group(1), m.group(2), text.count("\n", 0, m.start(2)) + 1)
        for m in MARKER.finditer(text)
    ]
    assert len(found) == text.count("```bash\n"), (
        f"{page}: a bash block without a guide-test marker"
    )
    return found


@dataclass
class Guide:
    page: Path
    cwd: Path
    values: dict[str, str]
    pending: list[Block] = field(default_factory=list)
    background: list[subprocess.Popen[bytes]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pending = [b for b in blocks(self.page) if b.kind != "skip"]
        command, installed = daemon_command()
        bin_dir = str(Path(command[0]).parent)
        environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("CDC_")}
        path = f"{bin_dir}{os.pathsep}{installed.get('PATH', environ.get('PATH', ''))}"
        self.env = {**environ, **installed, "PATH": path, "no_proxy": "127.0.0.1"}

    def next(self, timeout: float = 300) -> str:
        """Run the page's next block; its output (stdout and stderr)."""
        assert self.pending, f"{self.page}: no block left"
        block = self.pending.pop(0)
        where = f"{self.page.name}:{block.line}"
        names = block.exported()
        if names is not None:
            assert sorted(names) == sorted(self.values), (where, names)
            self.env.update(self.values)
            return ""
        if block.kind == "background":
            with open(self.cwd / f"background-{block.line}.log", "wb") as log:
                self.background.append(
                    subprocess.Popen(
                        ["bash", "-c", block.code], cwd=self.cwd, env=self.env, stdout=log,
                        stderr=subprocess.STDOUT, start_new_session=True,
                    )
                )  # fmt: skip
            return ""
        ran = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.code], cwd=self.cwd, env=self.env,
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        output = ran.stdout + ran.stderr
        assert ran.returncode == 0, f"{where} exited {ran.returncode}:\n{block.code}\n{output}"
        return output

    def done(self) -> None:
        assert not self.pending, f"{self.page}: blocks not run: {[b.line for b in self.pending]}"

    def stop(self) -> None:
        for process in self.background:
            stop_process(process, grace=15)
