"""A discrete-event model of a vLLM-like serving engine that writes what teller's collector records.

One call of :func:`simulate` models a capture window of ``steps`` engine steps of a deployment that is
already serving (requests in flight at the start): Poisson/bursty/ramp request arrivals, continuous
batching with chunked prefill under a token budget, paged KV-cache blocks with recompute preemption,
CUDA graphs for decode-only batches (or eager), tensor parallelism over ``tp`` ranks (one process
each, an all-reduce after attention and after the MLP of every layer, ranks coupled through it).

Per rank it writes one raw ``.tmsgpack`` file (``teller.rawfmt``): NVTX ranges (``engine_step``,
``schedule``, ``prepare_inputs``, ``forward``, ``model.layers.N``, ``attention``, ``mlp``, ``sample``,
``postprocess``), host operators, CUDA runtime calls and GPU kernels/copies whose durations come from
the roofline model of :mod:`teller.data.kernels`, modified by the fault :class:`~.faults.Effects`.
It returns the log lines and the fault windows; :mod:`teller.data.dataset` converts the raw files with
the same parser as real collections.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from teller.data import kernels as K
from teller.data.faults import HOST_FAULTS, KERNEL_FAULTS, Effects, Fault
from teller.data.logs import LogBook, client_addr, fmt_int, request_id
from teller.rawfmt import RawWriter

COMPUTE_STREAM = 7
FOREIGN_STREAM = 13
VLLM_VERSION = "0.10.2"  # the process prefix on every line (generator version 7; was 0.8.5)
HOST = "gpu-node-{:02d}"


@dataclass
class Workload:
    model: str
    gpu: str
    tp: int
    arrival: str  # poisson | bursty | ramp
    rate: float  # requests/s
    prompt_mean: int
    output_mean: int
    cuda_graphs: bool
    max_num_seqs: int
    max_num_batched_tokens: int
    steps: int
    traced_layers: int
    init_running: int
    kv_util: float  # target peak KV utilisation of the healthy run
    block_size: int = 16
    log_every_steps: int = 4

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Request:
    k: int
    arrival: float
    prompt: int
    output: int
    computed: int = 0  # tokens whose KV is in the cache
    generated: int = 0
    blocks: int = 0
    preempted: int = 0
    first_token: float = -1.0

    @property
    def total_needed(self) -> int:
        return self.prompt + self.generated

    @property
    def remaining(self) -> int:
        """Tokens that still need a forward pass (1 for a request in decode)."""
        return self.total_needed - self.computed

    @property
    def in_prefill(self) -> bool:
        return self.generated == 0 or self.remaining > 1


@dataclass
class SimResult:
    real_base: int
    end_ns: int  # simulation time of the last event
    faults: list[Fault]
    log: str
    stats: dict[str, Any] = field(default_factory=dict)
    raw_files: list[Path] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    # per rank, the error of its clock-sync record (ns): its events' trace times are true + error
    clock_errors: list[int] = field(default_factory=list)


class _Rank:
    """One tensor-parallel rank: its process, raw writer, host and GPU clocks."""

    def __init__(self, r: int, pid: int, writer: RawWriter, mono_base: int) -> None:
        self.r = r
        self.pid = pid
        self.tid = pid
        self.w = writer
        self.mono = mono_base
        self.host = 0.0  # simulation ns
        self.gpu = 0.0
        self.foreign = 0.0  # when the foreign stream is free (hbm_contention's visible neighbour)
        self.foreign_waiting: list[tuple[float, float, str]] = []  # its kernels not yet run
        self.corr = 0
        self.events = 0
        self.clock_error = 0  # (its clock-sync record's error, ns)
        self.open: list[int] = []

    def ts(self, t: float) -> int:
        return self.mono + int(t)

    def begin(self, name: str, t: float, args: dict[str, Any] | None = None) -> None:
        self.open.append(
            self.w.begin("annotation", name, tid=self.tid, ts=self.ts(t), domain="vllm", args=args)
        )

    def end(self, t: float) -> None:
        rid = self.open.pop()
        self.w.end(rid, tid=self.tid, ts=self.ts(t))
        self.events += 1

    def span(
        self, layer: str, name: str, s: float, e: float, corr: int = 0, args: dict[str, Any] | None = None
    ) -> None:
        self.w.span(layer, name, tid=self.tid, start=self.ts(s), end=self.ts(max(e, s)), corr=corr, args=args)
        self.events += 1

    def gpu_rec(
        self,
        layer: str,
        name: str,
        s: float,
        e: float,
        corr: int,
        stream: int = COMPUTE_STREAM,
        args: dict[str, Any] | None = None,
    ) -> None:
        self.w.gpu(
            layer,
            name,
            device=self.r,
            stream=stream,
            start=self.ts(s),
            end=self.ts(max(e, s + 1)),
            corr=corr,
            args=args,
        )
        self.events += 1

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr


class EngineSim:
    def __init__(
        self,
        workload: Workload,
        faults: list[Fault],
        rng: np.random.Generator,
        *,
        real_base: int,
        jitter: float = 0.06,
    ) -> None:
        self.wl = workload
        self.gpu = K.gpu_spec(workload.gpu)
        self.model = K.model_spec(workload.model)
        self.faults = faults
        self.fx = Effects(faults, workload.tp)
        self.rng = rng
        self.jit = jitter
        self.real_base = real_base
        self.log = LogBook(real_base)
        self.salt = int(rng.integers(1 << 30))
        self.node = HOST.format(int(rng.integers(1, 64)))
        self.api_pid = int(rng.integers(2000, 60000))
        self.engine_pid = self.api_pid + int(rng.integers(30, 200))
        # rank 0: in the engine core's process at TP 1 (vLLM's UniProcExecutor), a worker process of
        # its own beside it at TP > 1 (MultiprocExecutor; generator version 8: no draw, so that every
        # later draw, and the sample's plan, stay as they were)
        self.worker_pids = [self.engine_pid + (44 if workload.tp > 1 else 0)] + [
            self.engine_pid + 40 + 17 * r + int(rng.integers(0, 9)) for r in range(1, workload.tp)
        ]
        # The simulator traces `traced_layers` of the model's layers; arrivals, logging intervals and
        # throughputs run on a clock compressed by layers / traced_layers so the serving dynamics are
        # those of the full model.
        self.time_scale = self.model.layers / max(1, workload.traced_layers)
        self.stats: dict[str, Any] = {
            "steps": 0,
            "preemptions": 0,
            "reprefills": 0,
            "prefill_tokens": 0,
            "decode_tokens": 0,
            "graph_steps": 0,
            "eager_steps": 0,
            "max_kv_usage": 0.0,
            "finished": 0,
            "crashed": False,
            "max_waiting": 0,
        }

    # -- helpers ---------------------------------------------------------------------------------
    def _device_properties(self) -> list[dict[str, Any]]:
        """The GPUs every worker sees, as Kineto's ``deviceProperties`` entries (the subset of
        ``cudaGetDeviceProperties`` fields a roofline needs): what a capture says about its
        hardware, so that a kernel's time can be judged against the same GPU's."""
        g = self.gpu
        return [
            {
                "id": d,
                "name": g.name,
                "totalGlobalMem": int(g.memory_gib * 2**30),
                "computeMajor": g.sm // 10,
                "computeMinor": g.sm % 10,
            }
            for d in range(self.wl.tp)
        ]

    def j(self, sigma: float | None = None) -> float:
        return K.jitter(self.rng, self.jit if sigma is None else sigma)

    def proc(self, r: int) -> str:
        """The log prefix of rank ``r``'s process."""
        if r == 0 and self.wl.tp == 1:
            return self.core
        return f"(Worker_TP{r} pid={self.worker_pids[r]})"  # vLLM 0.10.2's name (0.10.0: VllmWorker rank=N)

    @property
    def core(self) -> str:
        """The engine core's log prefix (its scheduler, KV cache set-up and fatal errors)."""
        return f"(EngineCore_DP0 pid={self.engine_pid})"

    @property
    def api(self) -> str:
        return f"(APIServer pid={self.api_pid})"

    # -- workload --------------------------------------------------------------------------------
    def _draw_len(self, mean: int, lo: int, hi: int) -> int:
        return int(np.clip(self.rng.lognormal(math.log(max(mean, 2)), 0.6), lo, hi))

    def _arrivals(self, horizon_ns: float) -> list[Request]:
        wl = self.wl
        out: list[Request] = []
        t = 0.0
        k = 1000
        burst_on = True
        while t < horizon_ns:
            rate = wl.rate
            if wl.arrival == "bursty":
                # two-state MMPP: 4x rate in bursts, 0.25x between them
                if self.rng.random() < 0.08:
                    burst_on = not burst_on
                rate = wl.rate * (4.0 if burst_on else 0.25)
            elif wl.arrival == "ramp":
                rate = wl.rate * (0.3 + 1.7 * t / horizon_ns)
            t += self.rng.exponential(1e9 / max(rate, 1e-3)) / self.time_scale
            t_arr = t
            out.append(
                Request(
                    k, t_arr, self._draw_len(wl.prompt_mean, 8, 8192), self._draw_len(wl.output_mean, 4, 2048)
                )
            )
            k += 1
        out.sort(key=lambda q: (q.arrival, q.k))
        return out

    # -- main loop -------------------------------------------------------------------------------
    def run(self, raw_dir: Path) -> SimResult:
        wl, rng = self.wl, self.rng
        raw_dir.mkdir(parents=True, exist_ok=True)
        # rough step time to size the arrival horizon
        horizon = (wl.steps * 60e6 + 2e9) / self.time_scale
        arrivals = deque(self._arrivals(horizon))
        running: list[Request] = []
        waiting: deque[Request] = deque()
        for i in range(wl.init_running):
            q = Request(
                i,
                -float(rng.uniform(0.05e9, 3e9)),
                self._draw_len(wl.prompt_mean, 8, 8192),
                self._draw_len(wl.output_mean, 4, 2048),
            )
            q.generated = int(rng.integers(max(1, q.output // 2), max(2, q.output)))
            q.computed = q.prompt + q.generated - 1
            q.first_token = q.arrival + 0.05e9
            running.append(q)
        bs = wl.block_size
        # KV capacity: healthy peak demand / target utilisation
        demand = sum(math.ceil((q.prompt + q.output) / bs) for q in running)
        demand += sum(
            math.ceil((q.prompt + min(q.output, wl.steps)) / bs)
            for q in arrivals
            if q.arrival < wl.steps * 30e6 / self.time_scale
        )
        self.kv_blocks = max(64, int(demand / wl.kv_util))
        for q in running:
            q.blocks = math.ceil((q.computed + 1) / bs)
        kv_fault = self.fx.kv_burst()
        if kv_fault is not None:
            # an undersized cache (or a long-context burst on a full one): the in-flight requests
            # already hold most of it when the burst arrives
            init = sum(q.blocks for q in running)
            self.kv_blocks = max(64, int(init / float(rng.uniform(0.86, 0.93))))
        writers = []
        ranks: list[_Rank] = []
        mono0 = int(rng.integers(10**12, 9 * 10**12))
        for r in range(wl.tp):
            pid = self.worker_pids[r]
            mono = mono0 + int(rng.integers(-5000, 5000))  # same host clock, per-process read skew
            err = int(rng.integers(-2500, 2500))  # clock_sync read error
            path = raw_dir / f"teller-{self.node}-{pid}-0.tmsgpack"
            w = RawWriter(
                path,
                pid=pid,
                ppid=self.engine_pid if self.worker_pids[r] != self.engine_pid else self.api_pid,
                host=self.node,
                argv=[
                    "python3",
                    "-m",
                    "vllm.entrypoints.openai.api_server",
                    "--model",
                    self.model.name,
                    "--tensor-parallel-size",
                    str(wl.tp),
                ]
                + ([] if wl.cuda_graphs else ["--enforce-eager"]),
                clock_sync=(mono - 3 * 10**9, self.real_base - 3 * 10**9 + err),
                start_ns=mono - 3 * 10**9,
                env={
                    "RANK": str(r),
                    "LOCAL_RANK": str(r),
                    "WORLD_SIZE": str(wl.tp),
                    "LOCAL_WORLD_SIZE": str(wl.tp),
                    "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(wl.tp))),
                },
                producer="teller-sim 1",
                extra_meta={"deviceProperties": self._device_properties()},
            )
            w.thread_name(pid, "EngineCore" if pid == self.engine_pid else f"VllmWorker-{r}")
            writers.append(w)
            ranks.append(_Rank(r, pid, w, mono))
            ranks[-1].clock_error = err
            ranks[-1].host = float(rng.uniform(0, 20e3))
            ranks[-1].gpu = ranks[-1].host
        self._startup_logs()
        preempt_total = 0
        last_log_t = 0.0
        last_log_step = 0
        tok_prompt = 0
        tok_gen = 0
        oom = self.fx.oom()
        finished_pending: list[tuple[float, Request]] = []
        t_end = 0.0
        held: list[Request] = []  # requests delayed in the network (network_delay)
        kv_fault = self.fx.kv_burst()
        net = self.fx.has("network_delay")
        step_start: list[float] = []
        step_end: list[float] = []
        for step in range(wl.steps):
            self.fx.step = step
            t = max(rk.host for rk in ranks)
            if kv_fault is not None and step == kv_fault.start_step:
                burst = self._kv_burst(kv_fault, t)
                self.fx.count("kv_cache_exhaustion", "burst_requests", len(burst), window=False)
                arrivals = deque(sorted([*arrivals, *burst], key=lambda q: (q.arrival, q.k)))
            if net is not None and not net.active(step) and held:
                self.fx.count("network_delay", "released_requests", len(held), window=False, new=False)
                for q in held:
                    q.arrival = t - float(rng.uniform(0, 2e6))
                arrivals = deque(sorted([*arrivals, *held], key=lambda q: (q.arrival, q.k)))
                held = []
            t = self._admit(arrivals, waiting, held, t)
            if not running and not waiting:
                if not arrivals:
                    break
                t = max(t, arrivals[0].arrival + float(rng.uniform(20e3, 80e3)))
                t = self._admit(arrivals, waiting, held, t)
                for rk in ranks:
                    rk.host = t
            step_start.append(t)
            batch, n_prefill_tok, new_preempt = self._schedule(running, waiting, t)
            preempt_total += len(new_preempt)
            if kv_fault is not None and step >= kv_fault.start_step:
                self.fx.count("kv_cache_exhaustion", "preemptions", len(new_preempt), window=False)
            # vLLM V1's scheduler logs no line per preemption (V0's "Sequence group ... is preempted"
            # warning, once per 50, is gone) and its stats line no count (generator version 7): a
            # preemption shows as KV-cache usage, waiting requests and the victims' re-prefill
            if not batch:
                for rk in ranks:
                    rk.host = t + 200e3
                step_end.append(t + 200e3)
                continue
            crash = oom is not None and oom.active(step)
            t_done = self._step(ranks, step, batch, n_prefill_tok, t, crash)
            step_end.append(t_done)
            t_end = max(t_end, t_done)
            self.stats["steps"] += 1
            if crash:
                assert oom is not None
                self.fx.count("oom_error", "crashed_steps")
                self._oom_logs(oom, t_done, batch)
                self.stats["crashed"] = True
                break
            # progress of the requests in the batch
            for q, n in batch:
                if q.in_prefill:
                    tok_prompt += n
                    self.stats["prefill_tokens"] += n
                else:
                    tok_gen += n
                    self.stats["decode_tokens"] += n
                q.computed += n
                if q.computed >= q.total_needed:
                    q.generated += 1
                    if q.first_token < 0:
                        q.first_token = t_done
            still = []
            for q in running:
                if q.generated >= q.output:
                    self._free(q)
                    finished_pending.append((t_done, q))
                    self.stats["finished"] += 1
                else:
                    still.append(q)
            running[:] = still
            for tf, q in finished_pending:
                delay = self.fx.response_delay_ns() * float(rng.uniform(0.6, 1.4))
                if delay > 0:
                    self.fx.count("network_delay", "delayed_responses", extra_ns=delay)
                self.log.vllm(
                    tf + 30e3,
                    "INFO",
                    "logger.py:43",
                    self.api,
                    f"Finished request {request_id(q.k, self.salt)}.",
                )
                self.log.raw(
                    tf + 60e3 + delay,
                    self.api,
                    f'INFO:     {client_addr(q.k, self.salt)} - "POST /v1/completions HTTP/1.1" 200 OK',
                    "stdout",
                )
            finished_pending.clear()
            used = sum(q.blocks for q in running)
            usage = used / self.kv_blocks
            self.stats["max_kv_usage"] = max(self.stats["max_kv_usage"], usage)
            self.stats["max_waiting"] = max(self.stats["max_waiting"], len(waiting))
            if (step + 1 - last_log_step) >= wl.log_every_steps:
                dt = max(t_done - last_log_t, 1.0) * self.time_scale / 1e9
                msg = (
                    f"Engine 000: Avg prompt throughput: {tok_prompt / dt:.1f} tokens/s, "
                    f"Avg generation throughput: {tok_gen / dt:.1f} tokens/s, Running: {len(running)} reqs, "
                    f"Waiting: {len(waiting)} reqs, GPU KV cache usage: {100 * usage:.1f}%, "
                    f"Prefix cache hit rate: {self.prefix_hit:.1f}%"
                )
                # V1's stat logger runs in the API server process and prints no preemption count
                # (a Prometheus counter only, vllm:num_preemptions; generator version 7)
                self.log.vllm(t_done + 50e3, "INFO", "loggers.py:116", self.api, msg)
                last_log_t, last_log_step, tok_prompt, tok_gen = t_done, step + 1, 0, 0
        self.stats["preemptions"] = preempt_total
        self.stats["kv_blocks"] = self.kv_blocks
        self._fault_windows(step_start, step_end, t_end)
        self.fx.finish()
        for rk in ranks:
            rk.w.close()
        return SimResult(
            real_base=self.real_base,
            end_ns=int(max(t_end, max(rk.gpu for rk in ranks))),
            faults=self.faults,
            log=self.log.render(),
            stats=self.stats,
            raw_files=[Path(rk.w.path) for rk in ranks],
            pids=[rk.pid for rk in ranks],
            clock_errors=[rk.clock_error for rk in ranks],
        )

    def _admit(
        self, arrivals: deque[Request], waiting: deque[Request], held: list[Request], t: float
    ) -> float:
        """Move the requests that arrived by ``t`` to the waiting queue (or into the network-delay
        hold while the fault lasts)."""
        scale = self.fx.arrival_scale()
        while arrivals and arrivals[0].arrival <= t:
            q = arrivals.popleft()
            if scale < 1.0 and self.rng.random() > scale:
                held.append(q)
                self.fx.count("network_delay", "held_requests")
                continue
            waiting.append(q)
            self._log_request(q)
        return t

    def _kv_burst(self, f: Fault, t: float) -> list[Request]:
        """A burst of long-context requests, sized to overflow the KV cache by the severity."""
        need = self.kv_blocks * (0.03 + 0.5 * f.severity)
        out = []
        k = 90000
        while need > 0:
            p = int(self.rng.uniform(0.004, 0.02) * self.kv_blocks * self.wl.block_size) + 16
            out.append(Request(k, t, p, int(self.rng.uniform(200, 1200))))
            need -= p / self.wl.block_size
            t += float(self.rng.exponential(2e6)) / self.time_scale
            k += 1
        return out

    def _fault_windows(self, step_start: list[float], step_end: list[float], t_end: float) -> None:
        """Fault windows in simulation time: from the start of the first affected step to the end of
        the last one (clipped to the steps that ran)."""
        n = len(step_start)
        for f in self.faults:
            if n == 0:
                f.start_ns, f.end_ns = 0, int(t_end) + 1
                continue
            if f.start_step >= n:
                # a fault due after the run ended (a crash came first): never in force, an empty
                # window at the end (it used to be clamped onto the last step, culprits and all)
                f.start_ns = f.end_ns = int(step_end[-1])
                continue
            a = min(f.start_step, n - 1)
            b = min(f.end_step, n) - 1
            f.start_ns = int(step_start[a])
            f.end_ns = int(max(step_end[max(a, b)], step_start[a] + 1)) + (1 if f.type == "oom_error" else 0)
            if f.type in ("eager_mode_misconfig",):
                f.start_ns, f.end_ns = 0, int(t_end) + 1

    # -- scheduler -------------------------------------------------------------------------------
    def _free(self, q: Request) -> None:
        q.blocks = 0

    def _schedule(
        self, running: list[Request], waiting: deque[Request], t: float
    ) -> tuple[list[tuple[Request, int]], int, list[Request]]:
        """vLLM V1-style: running requests first (decode 1 token, or the next prefill chunk), then
        waiting ones, under the token budget, the sequence cap and the free KV blocks. A running
        request that cannot grow preempts the most recently admitted one (recompute)."""
        wl = self.wl
        bs = wl.block_size
        budget = wl.max_num_batched_tokens
        batch: list[tuple[Request, int]] = []
        preempted: list[Request] = []
        used = sum(q.blocks for q in running)
        i = 0
        while i < len(running) and budget > 0:
            q = running[i]
            n = min(q.remaining, budget)
            need = max(0, math.ceil((q.computed + n) / bs) - q.blocks)
            while used + need > self.kv_blocks and len(running) > i:
                # vLLM V1: preempt the lowest-priority (last admitted) running request, possibly q itself
                victim = running.pop()
                used -= victim.blocks
                victim.blocks = 0
                victim.computed = 0
                victim.preempted += 1
                waiting.appendleft(victim)
                preempted.append(victim)
            if i >= len(running) or used + need > self.kv_blocks:
                break
            q.blocks += need
            used += need
            batch.append((q, n))
            budget -= n
            i += 1
        if not preempted:
            while waiting and budget > 0 and len(running) < wl.max_num_seqs:
                q = waiting[0]
                n = min(q.remaining, budget)
                need = math.ceil((q.computed + n) / bs) - q.blocks
                if used + need > self.kv_blocks:
                    break
                waiting.popleft()
                if q.preempted and not q.computed:
                    self.stats["reprefills"] += 1  # a preempted request recomputed from its prompt
                q.blocks += need
                used += need
                running.append(q)
                batch.append((q, n))
                budget -= n
        n_prefill = sum(n for q, n in batch if q.in_prefill)
        return batch, n_prefill, preempted

    # -- one engine step -------------------------------------------------------------------------
    def _host(self, rk: _Rank, base_ns: float, t: float, kind: str = "", added: str | None = None) -> float:
        """A host duration: base x jitter x host factor, plus stalls. ``added``: the fault type the
        host work exists for (launch_storm's launches)."""
        clean = base_ns * self.j(0.12)
        d = clean * self.fx.host(rk.r)
        spike, parts = self.fx.host_spike(rk.r, self.rng, kind)
        if added is not None:
            self.fx.charge("host", rk.r, 0.0, d + spike, (added,), added=True)
        else:
            fx, r = self.fx, rk.r
            self.fx.charge(
                "host",
                r,
                clean + spike - sum(parts.values()),  # the benign pause is not the faults'
                d + spike,
                HOST_FAULTS,
                lambda f: clean * fx.host(r, skip=f) + spike - parts.get(f.type, 0.0),
            )
        return d + spike

    def _step(
        self,
        ranks: list[_Rank],
        step: int,
        batch: list[tuple[Request, int]],
        n_prefill: int,
        t0: float,
        crash: bool,
    ) -> float:
        wl, gpu, model, fx = self.wl, self.gpu, self.model, self.fx
        n_seqs = len(batch)
        n_tok = sum(n for _q, n in batch)
        ctx = sum(q.computed + n for q, n in batch)
        pairs = sum(n * (q.computed + n / 2) if q.in_prefill else q.computed + 1 for q, n in batch)
        use_graph = wl.cuda_graphs and not fx.eager() and n_prefill == 0 and n_seqs <= 512
        if fx.eager() and n_prefill == 0 and n_seqs <= 512:
            fx.count("eager_mode_misconfig", "eager_steps", window=False)  # a graph step without it
        self.stats["graph_steps" if use_graph else "eager_steps"] += 1
        # -- host: step start, schedule / receive, prepare inputs ---------------------------------
        for rk in ranks:
            rk.host = max(rk.host, t0) + float(self.rng.uniform(1e3, 6e3))
            rk.begin(f"engine_step#{step}", rk.host, args={"num_seqs": n_seqs, "num_tokens": n_tok})
        r0 = ranks[0]
        s = r0.host
        r0.begin("schedule", s)
        r0.host = s + self._host(r0, 90e3 + 6e3 * n_seqs, s, "schedule")
        r0.end(r0.host)
        t_sched = r0.host
        for rk in ranks[1:]:
            s = rk.host
            rk.begin("recv_scheduler_output", s)
            rk.host = max(s, t_sched) + self._host(rk, 25e3, s, "recv")
            rk.end(rk.host)
        blocks_per_seq = max(1, ctx // max(n_seqs, 1) // wl.block_size)
        in_bytes = n_tok * 12 + n_seqs * blocks_per_seq * 4 + n_seqs * 32
        guided = self.rng.random() < 0.35
        for rk in ranks:
            s = rk.host
            rk.begin("prepare_inputs", s)
            h = s + self._host(rk, 40e3 + 25 * n_tok + 1.5e3 * n_seqs, s, "prepare_inputs")
            copies = [in_bytes] + ([n_seqs * model.vocab // 8] if guided else [])
            for nb in copies:
                h = self._memcpy(rk, h, nb, "HtoD")
            rk.host = h + self._host(rk, 8e3, h)
            rk.end(rk.host)
        # -- forward -------------------------------------------------------------------------------
        for rk in ranks:
            rk.begin("forward", rk.host, args={"cuda_graph": use_graph})
        ops: list[tuple[str, K.KernelCost | None]] = [("", K.embedding_kernel(model, n_tok))]
        n_layers = wl.traced_layers
        crash_layer = int(self.rng.integers(0, n_layers)) if crash else -1
        for li in range(n_layers):
            ops.append((f"+model.layers.{li}", None))
            for sub, ks in K.layer_kernels(gpu, model, wl.tp, n_tok, n_prefill, int(pairs), ctx):
                ops.append((f"+{sub}", None))
                for k in ks:
                    ops.append(("", k))
                ops.append(("-", None))
                if li == crash_layer and sub == "attention":
                    ops.append(("!crash", None))
                    break
            if li == crash_layer:
                break
            ops.append(("-", None))
        graph_corr: list[int] = []
        if use_graph:
            for rk in ranks:
                s = rk.host
                c = rk.next_corr()
                d = self._host(rk, 14e3 + 0.15e3 * n_layers, s)
                rk.span("runtime", "cudaGraphLaunch", s, s + d, corr=c)
                rk.host = s + d
                rk.gpu = max(rk.gpu, rk.host + 4e3)
                graph_corr.append(c)
        crashed = False
        for marker, kc in ops:
            if marker == "!crash":
                crashed = True
                break
            if kc is None:
                if use_graph:
                    continue  # no host ranges during a graph replay
                for rk in ranks:
                    if marker.startswith("+"):
                        rk.begin(marker[1:], rk.host)
                    else:
                        rk.host += self._host(rk, 1.5e3, rk.host)
                        rk.end(rk.host)
                    rk.host += 1e3
                continue
            self._kernel(ranks, kc, use_graph, graph_corr)
        if crashed:
            return max(max(rk.host for rk in ranks), max(rk.gpu for rk in ranks))
        for rk in ranks:
            if use_graph:
                rk.host = rk.host + self._host(rk, 6e3, rk.host)
            rk.end(rk.host)
        # -- sample ----------------------------------------------------------------------------------
        for rk in ranks:
            rk.begin("sample", rk.host)
        for kc in K.head_kernels(gpu, model, wl.tp, n_tok, n_seqs):
            self._kernel(ranks, kc, False, [])
        storm = fx.launch_storm()
        if storm:
            self._launch_storm(ranks, storm * max(1, n_seqs // 4))
        for rk in ranks:
            h = self._memcpy(rk, rk.host, n_seqs * 8 + n_seqs * 160, "DtoH")
            # the sampled ids must be on the host: wait for the stream
            s = h
            d = self._host(rk, 3e3, s)
            e = max(s + d, rk.gpu + 2e3)
            rk.span("runtime", "cudaStreamSynchronize", s, e)
            rk.host = e
            rk.end(rk.host)
        # -- postprocess (engine core only) ------------------------------------------------------------
        s = r0.host
        r0.begin("postprocess", s)
        r0.host = s + self._host(r0, 30e3 + 9e3 * n_seqs, s, "postprocess")
        r0.end(r0.host)
        for rk in ranks:
            rk.host += float(self.rng.uniform(2e3, 8e3))
            rk.end(rk.host)
        self._foreign(ranks, t0, max(rk.host for rk in ranks))
        return max(rk.host for rk in ranks)

    def _memcpy(self, rk: _Rank, h: float, nbytes: int, kind: str) -> float:
        """A cudaMemcpyAsync from/to pageable memory: the call returns when the copy is done."""
        c = rk.next_corr()
        s = h + self._host(rk, 2e3, h)
        pf = self.fx.pcie(rk.r)
        lat_f = 1.0 + 3.0 * (1.0 / pf - 1.0) / 12.0  # latency x (1 + 3 s); bandwidth / (1 + 12 s)
        gs0 = max(s + 3e3, rk.gpu)
        gs = self.fx.slice_start(rk.r, gs0)
        jj = self.j()
        gd = K.memcpy_ns(self.gpu, nbytes, pcie=pf, latency=lat_f) * jj
        self.fx.waited(rk.r, gs - gs0, gd)
        clean = gd if pf == 1.0 else K.memcpy_ns(self.gpu, nbytes) * jj
        self.fx.charge("gpu", rk.r, clean, gd, ("pcie_degradation",))
        rk.gpu_rec(
            "memcpy",
            f"Memcpy {kind} (Pageable -> Device)" if kind == "HtoD" else "Memcpy DtoH (Device -> Pageable)",
            gs,
            gs + gd,
            c,
            args={"bytes": int(nbytes), "kind": kind},
        )
        rk.gpu = gs + gd
        e = gs + gd + 1.5e3
        rk.span("runtime", "cudaMemcpyAsync", s, e, corr=c, args={"bytes": int(nbytes), "kind": kind})
        return e

    def _kernel(
        self,
        ranks: list[_Rank],
        kc: K.KernelCost,
        graph: bool,
        graph_corr: list[int],
        added: str | None = None,
    ) -> None:
        """One kernel on every rank; an all-reduce ends when the last rank has arrived. ``added``: the
        fault type the kernel exists for (its whole time is that fault's effect)."""
        starts: list[float] = []
        corrs: list[int] = []
        for rk in ranks:
            if graph:
                c = graph_corr[rk.r]
                st = rk.gpu + float(self.rng.uniform(0.6e3, 1.4e3))
            else:
                s = rk.host
                d_op = self._host(rk, 9e3 if kc.family != "all_reduce" else 12e3, s, kc.op, added)
                c = rk.next_corr()
                ls = s + d_op * 0.55
                ld = self._host(rk, 4.5e3, ls, added=added)
                rk.span("runtime", "cudaLaunchKernel", ls, ls + ld, corr=c)
                e_op = ls + ld + d_op * 0.45
                rk.span("host_op", kc.op, s, e_op)
                rk.host = e_op
                st = max(ls + ld + 2.5e3, rk.gpu)
            starts.append(st)
            corrs.append(c)
        if kc.family == "all_reduce":
            for i, rk in enumerate(ranks):
                st = self.fx.slice_start(rk.r, starts[i])
                self.fx.waited(rk.r, st - starts[i], 0.0)
                starts[i] = st
            t_all = max(starts)
            link = self.fx.link()
            base = K.all_reduce_ns(self.gpu, kc.bytes, self.wl.tp, link=link)
            base0 = base if link == 1.0 else K.all_reduce_ns(self.gpu, kc.bytes, self.wl.tp)
            for rk, st, c in zip(ranks, starts, corrs, strict=True):
                jj = self.j(0.03)
                self.fx.charge("gpu", rk.r, base0 * jj, base * jj, ("nvlink_degradation",))
                e = t_all + base * jj
                rk.gpu_rec(
                    "kernel", kc.name, st, e, c, args={"collective": "allreduce", "bytes": int(kc.bytes)}
                )
                rk.gpu = e
            return
        for rk, st, c in zip(ranks, starts, corrs, strict=True):
            clock, mem, jj = self.fx.clock(rk.r), self.fx.mem(rk.r), self.j()
            d = K.roofline_ns(self.gpu, kc, clock=clock, mem=mem) * jj
            if added is not None:  # a kernel that exists only because of the fault
                self.fx.charge("gpu", rk.r, 0.0, d, (added,), added=True)
            elif clock == mem == 1.0:
                self.fx.charge("gpu", rk.r, d, d, KERNEL_FAULTS)
            else:
                self.fx.charge(
                    "gpu",
                    rk.r,
                    K.roofline_ns(self.gpu, kc) * jj,
                    d,
                    KERNEL_FAULTS,
                    self._kernel_without(kc, rk.r, jj),
                )
            st0, st = st, self.fx.slice_start(rk.r, st)  # a time-sliced neighbour may hold the GPU
            self.fx.waited(rk.r, st - st0, d)
            rk.gpu_rec("kernel", kc.name, st, st + d, c)
            rk.gpu = st + d

    def _kernel_without(self, kc: K.KernelCost, r: int, jj: float) -> Callable[[Fault], float]:
        """The kernel's time on rank ``r`` without one fault (for its marginal effect)."""
        fx = self.fx
        return lambda f: K.roofline_ns(self.gpu, kc, clock=fx.clock(r, skip=f), mem=fx.mem(r, skip=f)) * jj

    def _launch_storm(self, ranks: list[_Rank], n: int) -> None:
        for _ in range(n):
            kc = K.KernelCost("elementwise", K.KERNEL_NAMES["foreign_elementwise"], 0.0, 64e3, "aten::add_")
            self._kernel(ranks, kc, False, [], added="launch_storm")

    def _foreign(self, ranks: list[_Rank], t0: float, t1: float) -> None:
        for rk in ranks:
            # kernels whose turn came after the previous step's end run first (the neighbour's queue
            # runs on, whether or not it still adds to it)
            waiting, rk.foreign_waiting = rk.foreign_waiting, []
            drawn: list[tuple[float, float, str]] = []
            rate = self.fx.foreign_rate(rk.r)
            if rate > 0:
                n = int(self.rng.poisson(rate * (t1 - t0) / 1e6))
                for _ in range(n):
                    s = float(self.rng.uniform(t0, t1))
                    name = K.KERNEL_NAMES[
                        "foreign_copy" if self.rng.random() < 0.5 else "foreign_elementwise"
                    ]
                    drawn.append((s, float(self.rng.uniform(30e3, 400e3)), name))
            # One stream runs its kernels one after another: a kernel drawn to start while the one
            # before it runs starts when that one ends (generator version 5; before, they overlapped on
            # the stream, which a loader reads as improper nesting). The draws are those of version 4,
            # in the same order, so no other sample changes. A kernel whose turn comes after the
            # step's end waits for the next step; those still waiting when the capture ends are not
            # recorded.
            kept = 0
            for s, d, name in waiting + sorted(drawn, key=lambda x: x[0]):
                s = max(s, rk.foreign)
                if s >= t1:
                    rk.foreign_waiting.append((s, d, name))
                    continue
                rk.gpu_rec("kernel", name, s, s + d, 0, stream=FOREIGN_STREAM)
                rk.foreign, kept = s + d, kept + 1
            # (window=False: a waiting kernel may run in a step after the fault's last)
            self.fx.count("hbm_contention", "foreign_kernels", kept, window=False)

    # -- logs ------------------------------------------------------------------------------------
    def _startup_logs(self) -> None:
        wl, rng = self.wl, self.rng
        # Lines are buffered and written at the end, shifted so that the last of them comes at least
        # a second before serving starts (time 0): the draws below can add up to 82 s after a start
        # drawn 60-200 s back, which put "Starting vLLM API server" after the first requests in 25 of
        # `default`'s 2 600 samples before generator version 4. The draws are unchanged, so every other
        # sample's bytes are too.
        buf: list[tuple[float, str, str, str, str]] = []

        def line(t_sim: float, level: str, src: str, proc: str, msg: str) -> None:
            buf.append((t_sim, level, src, proc, msg))

        self.prefix_hit = float(rng.uniform(0, 40))
        t = -float(rng.uniform(60e9, 200e9))
        eager = (not wl.cuda_graphs) or self.fx.eager()
        # (the engine core's lines; rank 0 is in its process at TP 1 only)
        P = self.core
        line(t, "INFO", "api_server.py:1043", self.api, f"vLLM API server version {VLLM_VERSION}")
        line(
            t + 2e6,
            "INFO",
            "utils.py:328",
            self.api,
            # the arguments that differ from vLLM's defaults; request logging is on (0.10.2 logs no
            # request lines without --enable-log-requests)
            "non-default args: {"
            + (f"'model': '{self.model.name}', ")
            + (f"'tensor_parallel_size': {wl.tp}, " if wl.tp > 1 else "")
            + f"'max_num_seqs': {wl.max_num_seqs}, 'max_num_batched_tokens': {wl.max_num_batched_tokens}, "
            + ("'enforce_eager': True, " if eager else "")
            + "'enable_log_requests': True}",
        )
        if eager:
            # the fault's evidence in the log: enforce_eager=True twice, this warning, no graph
            # capture. The warning comes from the VllmConfig's checks, which run in the API server
            # (the engine core gets the config built; generator version 8; before, the engine core)
            self.fx.count("eager_mode_misconfig", "startup_lines", 3, window=False)
            line(
                t + 3e8,
                "WARNING",
                "cuda.py:93",
                self.api,
                "To see benefits of async output processing, enable CUDA graph. Since, enforce-eager "
                "is enabled, async output processor cannot be used",
            )
        t += float(rng.uniform(3e9, 8e9))
        line(
            t,
            "INFO",
            "core.py:58",
            P,
            f"Initializing a V1 LLM engine (v{VLLM_VERSION}) with config: model='{self.model.name}', "
            f"dtype=torch.bfloat16, max_seq_len=8192, tensor_parallel_size={wl.tp}, "
            f"enforce_eager={eager}, kv_cache_dtype=auto, seed=0, "
            f'compilation_config={{"level":{0 if eager else 3},"use_cudagraph":{str(not eager).lower()}}}',
        )
        if wl.tp > 1:
            for r in range(wl.tp):
                line(
                    t + 3e9 + r * 1e6,
                    "INFO",
                    "custom_all_reduce_utils.py:244",
                    self.proc(r),
                    "reading GPU P2P access cache from /root/.cache/vllm/gpu_p2p_access_cache_for_"
                    f"{','.join(map(str, range(wl.tp)))}.json",
                )
        t += float(rng.uniform(5e9, 40e9))
        wgib = self.model.weight_bytes() / wl.tp / 2**30
        for r in range(wl.tp):
            line(
                t + r * 3e6,
                "INFO",
                "gpu_model_runner.py:1329",
                self.proc(r),
                f"Model loading took {wgib:.4f} GiB and {rng.uniform(3, 40):.6f} seconds",
            )
        t += float(rng.uniform(2e9, 6e9))
        kv_tokens = self.kv_blocks * wl.block_size
        line(t, "INFO", "kv_cache_utils.py:634", P, f"GPU KV cache size: {fmt_int(kv_tokens)} tokens")
        line(
            t + 1e5,
            "INFO",
            "kv_cache_utils.py:637",
            P,
            f"Maximum concurrency for 8,192 tokens per request: {kv_tokens / 8192:.2f}x",
        )
        if not eager:
            t += float(rng.uniform(8e9, 25e9))
            line(
                t,
                "INFO",
                "gpu_model_runner.py:1686",
                self.proc(0),
                f"Graph capturing finished in {rng.integers(8, 30)} secs, took "
                f"{rng.uniform(0.3, 1.2):.2f} GiB",
            )
        t += float(rng.uniform(1e9, 3e9))
        line(
            t,
            "INFO",
            "core.py:159",
            P,
            f"init engine (profile, create kv cache, warmup model) took {rng.uniform(20, 90):.2f} seconds",
        )
        line(t + 5e8, "INFO", "launcher.py:28", self.api, "Starting vLLM API server 0 on http://0.0.0.0:8000")
        shift = min(0.0, -1e9 - max(b[0] for b in buf))
        for t_sim, level, src, proc, msg in buf:
            self.log.vllm(t_sim + shift, level, src, proc, msg)

    def _log_request(self, q: Request) -> None:
        self.log.vllm(
            q.arrival + 20e3,
            "INFO",
            "logger.py:39",
            self.api,
            f"Received request {request_id(q.k, self.salt)}: prompt: '', params: SamplingParams(n=1, "
            f"temperature=0.7, top_p=0.95, max_tokens={q.output}), prompt_token_ids: [{q.prompt} tokens], "
            "prompt_embeds shape: None, lora_request: None.",
        )

    def _oom_logs(self, f: Fault, t: float, batch: list[tuple[Request, int]]) -> None:
        rng = self.rng
        r = int(f.target.get("rank") or 0)
        P = self.proc(r)
        tried = float(rng.uniform(0.5, 4.0))
        free = float(rng.uniform(0.05, 1.0))
        site = "/usr/local/lib/python3.12/dist-packages/vllm"
        tb = [
            "Traceback (most recent call last):",
            f'  File "{site}/v1/engine/core.py", line 521, in run_engine_core',
            "    engine_core.run_busy_loop()",
            f'  File "{site}/v1/worker/gpu_model_runner.py", line 1163, in execute_model',
            "    hidden_states = self.model(",
            f'  File "{site}/model_executor/models/llama.py", line 368, in forward',
            "    hidden_states, residual = layer(positions, hidden_states, residual)",
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried:.2f} GiB. GPU {r} has a "
            f"total capacity of {self.gpu.memory_gib:.2f} GiB of which {free:.2f} GiB is free. Process "
            f"{self.worker_pids[r]} has {self.gpu.memory_gib - free:.2f} GiB memory in use. Of the allocated "
            f"memory {self.gpu.memory_gib * 0.93:.2f} GiB is allocated by PyTorch, and "
            f"{rng.uniform(0.1, 0.9):.2f} GiB is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
        ]
        site_core = f'  File "{site}/v1/engine/core.py", line 521, in run_engine_core'

        def exception(t0: float, src: str, proc: str, msg: str, lines: list[str]) -> None:
            # logger.exception: vLLM's formatter repeats the record's header on each line of the
            # traceback, and the process wrapper its prefix (generator version 7); vLLM's handler
            # writes to stdout, errors included (version 8; before, stderr)
            for k, text in enumerate([msg, *lines]):
                self.log.vllm(t0 + k * 1e3, "ERROR", src, proc, text, "stdout")

        if P == self.core:  # (TP 1: rank 0 runs in the engine core's process)
            exception(t + 0.3e6, "core.py:526", P, "EngineCore encountered a fatal error.", tb)
        else:
            # the worker process that failed, then the engine core that waited for it
            exception(
                t + 0.3e6,
                "multiproc_executor.py:596",
                P,
                "WorkerProc hit an exception.",
                [
                    tb[0],
                    f'  File "{site}/v1/executor/multiproc_executor.py", line 591, in worker_busy_loop',
                    "    output = func(*args, **kwargs)",
                ]
                + tb[3:],
            )
            exception(
                t + 0.6e6,
                "core.py:526",
                self.core,
                "EngineCore encountered a fatal error.",
                [
                    tb[0],
                    site_core,
                    "    engine_core.run_busy_loop()",
                    f'  File "{site}/v1/executor/multiproc_executor.py", line 243, in collective_rpc',
                    "    raise RuntimeError(",
                    f"RuntimeError: Worker failed with error '{tb[-1].split(': ', 1)[1]}', please "
                    "check the stack trace above for the root cause",
                ],
            )
        exception(
            t + 2e6,
            "async_llm.py:399",
            self.api,
            "AsyncLLM output_handler failed.",
            [
                tb[0],
                f'  File "{site}/v1/engine/async_llm.py", line 380, in output_handler',
                "    outputs = await engine_core.get_output_async()",
                "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
                "See stack trace (above) for the root cause.",
            ],
        )
        for q, _n in batch[:4]:
            self.log.raw(
                t + 3e6,
                self.api,
                f'INFO:     {client_addr(q.k, self.salt)} - "POST /v1/completions HTTP/1.1" '
                "500 Internal Server Error",
                "stdout",
            )
        self.log.vllm(t + 5e6, "INFO", "launcher.py:80", self.api, "Shutting down FastAPI HTTP server.")


def simulate(
    workload: Workload,
    faults: list[Fault],
    rng: np.random.Generator,
    raw_dir: Path,
    *,
    real_base: int,
    jitter: float = 0.06,
) -> SimResult:
    """Run the engine model and write one raw file per rank into ``raw_dir``."""
    return EngineSim(workload, faults, rng, real_base=real_base, jitter=jitter).run(raw_dir)
