"""Log lines in the shapes of a real vLLM (V1) deployment, as teller's log tee records them.

``log.txt`` of a sample has one line per log line: ``<realtime_ns> <stream> <text>``, the format
``teller collect`` writes (the tee stamps each line with the trace clock). ``text`` is what the engine
printed: ``(Proc pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message``. vLLM V1 wraps each process's
stdout and stderr so that every line it writes starts with the process prefix, tracebacks and
uvicorn's access lines included (generator version 7; before, the prefix came after ``[file.py:line]``
and raw lines had none).
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field


@dataclass
class LogBook:
    """Collects log lines with their realtime timestamps; ``render`` sorts them stably."""

    real_base: int  # realtime ns of simulation time 0
    lines: list[tuple[int, int, str, str]] = field(default_factory=list)  # (ts, seq, stream, text)

    def add(self, t_sim: float, text: str, stream: str = "stdout") -> None:
        self.lines.append((self.real_base + int(t_sim), len(self.lines), stream, text))

    def vllm(self, t_sim: float, level: str, src: str, proc: str, msg: str, stream: str = "stdout") -> None:
        self.add(t_sim, f"{proc} {level} {_stamp(self.real_base + int(t_sim))} [{src}] {msg}", stream)

    def raw(self, t_sim: float, proc: str, text: str, stream: str = "stdout") -> None:
        """A line the process printed without vLLM's logger (a traceback, uvicorn's access log)."""
        self.add(t_sim, f"{proc} {text}", stream)

    def render(self) -> str:
        out = [f"{ts} {stream} {text}" for ts, _seq, stream, text in sorted(self.lines)]
        return "\n".join(out) + ("\n" if out else "")


def _stamp(real_ns: int) -> str:
    d = _dt.datetime.fromtimestamp(real_ns // 1_000_000_000, tz=_dt.timezone.utc)
    return d.strftime("%m-%d %H:%M:%S")


def fmt_int(n: int) -> str:
    return f"{n:,}"


def request_id(k: int, salt: int) -> str:
    return f"cmpl-{(k * 2654435761 + salt) & 0xFFFFFFFFFFFF:012x}{k:04x}"


def client_addr(k: int, salt: int) -> str:
    a = (k * 7919 + salt) % 250 + 2
    port = 30000 + (k * 104729 + salt) % 30000
    return f"10.0.{(salt >> 3) % 200 + 1}.{a}:{port}"
