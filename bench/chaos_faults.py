"""The chaos controller: starts the gateway, workers and beat, then runs the fault schedule
(SIGKILL a random worker every few seconds and start a new one; restart the gateway, beat, Redis
and Postgres once each), from the main thread so every child is its own process group we reap."""

from __future__ import annotations

import random
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.services import DedicatedPostgres, DedicatedRedis
from bench.stack import BenchStack
from tests.support.processes import Proc

QUEUES = "agent,tools,subagents,outbound,scheduler"


@dataclass
class Controller:
    stack: BenchStack
    redis: DedicatedRedis
    postgres: DedicatedPostgres
    gateway_port: int
    n_workers: int = 3
    concurrency: int = 16
    workers: list[Proc] = field(default_factory=list)
    gateway: Proc | None = None
    beat: Proc | None = None
    began: float = field(default_factory=time.monotonic)
    began_wall: float = field(default_factory=time.time)  # the same instant as `began`, by the wall clock
    events: list[tuple[float, str]] = field(default_factory=list)

    def log(self, what: str) -> None:
        at = time.monotonic() - self.began
        self.events.append((at, what))
        print(f"  [{at:6.1f}s] {what}", flush=True)

    def start(self) -> None:
        self.gateway = self.stack.gateway(self.gateway_port)
        self.workers = [self.stack.worker(concurrency=self.concurrency) for _ in range(self.n_workers)]
        self.beat = self.stack.beat()
        self.began, self.began_wall = time.monotonic(), time.time()

    def kill_times(self) -> list[float]:
        """Wall-clock times of every worker SIGKILL."""
        return [self.began_wall + at for at, what in self.events if what.startswith("SIGKILL worker")]

    def _spawn_worker(self) -> Proc:
        """A worker, not waited for (Redis may be down right now); it connects when it can."""
        name = f"chaos-{uuid.uuid4().hex[:6]}@%h"
        argv = [sys.executable, "-m", "celery", "-A", "workers.app:app", "worker", "-Q", QUEUES, "-P", "threads",
                "-c", str(self.concurrency), "-n", name, "--without-mingle", "--without-gossip", "-E", "-l", "INFO"]
        proc = Proc(argv, self.stack.env, self.stack.log_dir / f"worker-{name.split('@')[0]}.log")
        self.stack.procs.append(proc)
        return proc

    def _reap(self, proc: Proc) -> None:
        proc.kill(signal.SIGKILL)
        if proc in self.stack.procs:
            self.stack.procs.remove(proc)

    def kill_worker(self) -> bool:
        """SIGKILL a random worker that is up (killing one still booting tests nothing); False if none is."""
        ready = [w for w in self.workers if w.alive() and " ready." in w.log()]
        if len(ready) < 2:  # keep one worker up, or the run measures boot times, not recovery
            return False
        victim = random.choice(ready)
        self._reap(victim)
        self.workers.remove(victim)
        self.workers.append(self._spawn_worker())
        self.log(f"SIGKILL worker pid {victim.pid} ({victim.log_path.name}); started a new one")
        return True

    def restart_gateway(self) -> None:
        assert self.gateway is not None
        pid = self.gateway.pid
        self._reap(self.gateway)
        started = time.monotonic()
        self.gateway = self.stack.gateway(self.gateway_port)
        self.log(f"SIGKILL gateway pid {pid}; back after {time.monotonic() - started:.1f}s")

    def kill_beat(self) -> None:
        assert self.beat is not None
        pid = self.beat.pid
        self._reap(self.beat)
        self.beat = self.stack.beat()
        self.log(f"SIGKILL beat pid {pid}; started a new one (it waits for the dead one's lock)")

    def restart_redis(self) -> None:
        down = self.redis.restart()
        self.log(f"SIGKILL redis-server; restarted empty after {down:.1f}s (queues, schedule, events lost)")

    def restart_postgres(self) -> None:
        down = self.postgres.restart()
        self.log(f"SIGKILL postgres (all backends); crash recovery, back after {down:.1f}s")

    def supervise(self) -> None:
        """Restart what died on its own, as compose's `restart: unless-stopped` would; each is logged
        (a process that dies by itself under a fault is a finding)."""
        if self.beat is not None and not self.beat.alive():
            last = self.beat.log().strip().splitlines()[-1:] or [""]
            self._reap(self.beat)
            self.beat = self.stack.beat()
            self.log(f"beat EXITED BY ITSELF ({last[0][:160]}); restarted it")
        for worker in [w for w in self.workers if not w.alive()]:
            self._reap(worker)
            self.workers.remove(worker)
            self.workers.append(self._spawn_worker())
            self.log(f"worker {worker.log_path.name} EXITED BY ITSELF; started a new one")
        if self.gateway is not None and not self.gateway.alive():
            self._reap(self.gateway)
            self.gateway = self.stack.gateway(self.gateway_port)
            self.log("gateway EXITED BY ITSELF; restarted it")

    def run(self, *, seconds: float, kill_every: float, singles: list[tuple[float, str]],
            stop: Callable[[], bool]) -> None:
        """Until `seconds` have passed (and at least the singles ran): kill a worker every
        `kill_every` seconds; run each single fault at its time (fraction of `seconds`)."""
        actions: dict[str, Callable[[], None]] = {
            "gateway": self.restart_gateway, "beat": self.kill_beat, "redis": self.restart_redis,
            "postgres": self.restart_postgres,
        }
        pending = sorted((frac * seconds, name) for frac, name in singles)
        next_kill = kill_every
        while True:
            now = time.monotonic() - self.began
            if pending and now >= pending[0][0]:
                actions[pending.pop(0)[1]]()
            elif now >= next_kill and now < seconds:
                if self.kill_worker():
                    next_kill = now + kill_every * random.uniform(0.6, 1.4)
            elif (now >= seconds and not pending) or stop():
                return
            self.supervise()
            time.sleep(0.05)
