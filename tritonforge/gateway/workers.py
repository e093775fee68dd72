"""The gateway's worker processes, balanced by open connections (`tritonforge openai --workers N`).

A streaming client holds its HTTP connection for many requests (perf_analyzer, the `openai` client's pool),
so the connection decides which worker does a stream's per-chunk work for as long as it lives. With uvicorn's
own workers (one shared listening socket) the worker that wakes first accepts every connection waiting then:
128 connections opened together were split 45 / 45 / 30 / 8 over 4 workers, so one worker had more than five
times another's streams to serve. SO_REUSEPORT spreads them by a hash, no better (22 / 28 / 34 / 44).

Here every worker watches the shared listening socket, and a worker accepts only while no other has fewer
open connections; each publishes its count in a shared array. A waiting connection wakes every worker (the
socket is level-triggered) until the least loaded one's event loop takes it. The check and the accept happen
under one lock shared by the workers: without it two workers that both read the same counts both accept, and
the counts drift apart. The parent process starts the
workers, starts a new one in place of one that died after it served, and stops them all on SIGINT or SIGTERM; a
worker that dies before it ever served (its app failing to build, say) stops them all, naming its error: its
successor would fail the same way, for ever.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time

import uvicorn

from . import STOP_GRACE_S, GatewayFailed, stop_line

logger = logging.getLogger(__name__)

NOT_SERVING = 2**31 - 1  # a worker's count while it starts or after it died: never the least loaded
RESTART_PAUSE_S = 1.0  # before starting a dead worker's successor, so that a crash loop does not spin
BACKLOG = 2048  # uvicorn's default
READY_MESSAGE = "gateway workers serving"  # printed once every worker takes connections
ACCEPT_LOCK_STUCK_S = 1.0  # the accept lock held this long after a worker died was held by the dead one
ACCEPT_ERROR_PAUSE_S = 0.1  # a worker that failed to accept stops trying that long (else it spins)


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:  # the CLI reports a ValueError as a one-line error
        sock.close()
        raise ValueError(f"--host/--port: cannot listen on {host}:{port} ({error.strerror})") from None
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


def serve_workers(make_app, *, host: str, port: int, workers: int, log_level: str = "warning",
                  on_worker_exit=None, on_ready=lambda line: None, on_stop=lambda line: None) -> None:
    """Serve the ASGI app `make_app()` builds (a picklable callable: each worker builds its own) from `workers`
    processes on host:port until SIGINT or SIGTERM; `on_worker_exit(pid)` is called for a worker that died,
    `on_ready(line)` once, when every worker takes connections; `on_stop(line)` when a stop begins. Raises
    GatewayFailed when a worker dies before it served."""
    context = multiprocessing.get_context("spawn")
    counts = context.Array("i", [NOT_SERVING] * workers, lock=False)
    served = context.Array("b", [0] * workers, lock=False)  # set by a worker once it takes connections
    failures = context.SimpleQueue()  # (index, error) of a worker that could not start
    accepting = context.Lock()
    sock = listening_socket(host, port)
    stopping = False

    def start(index: int):
        served[index] = 0
        process = context.Process(target=_worker_main, name=f"openai-gateway-{index}",
                                  args=(index, sock, counts, served, failures, accepting, os.getpid(), make_app,
                                        log_level))
        process.start()
        return process

    def stop(*_):
        nonlocal stopping
        if not stopping:
            on_stop(stop_line())
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    processes = [start(index) for index in range(workers)]
    announced = False
    try:
        while not stopping:
            time.sleep(0.2)
            if not announced and all(count != NOT_SERVING for count in counts):
                on_ready(f"{READY_MESSAGE}: {workers} on {host}:{port}")
                announced = True
            for index, process in enumerate(processes):
                if not process.is_alive() and not stopping:
                    counts[index] = NOT_SERVING
                    if not served[index]:
                        raise GatewayFailed(f"gateway worker {index} exited (status {process.exitcode}) before it "
                                            f"served: {_failure_of(index, failures)}")
                    logger.error("gateway worker %d (pid %s) exited with %s; starting another", index,
                                 process.pid, process.exitcode)
                    if on_worker_exit is not None:
                        on_worker_exit(process.pid)
                    _free_if_held_by_the_dead(accepting)
                    time.sleep(RESTART_PAUSE_S)
                    processes[index] = start(index)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: uvicorn finishes the responses under way, then exits
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _free_if_held_by_the_dead(accepting) -> None:
    """A worker holds the accept lock for microseconds; one killed inside it would stop every worker from
    accepting, so a lock still held a second after a worker died was held by that worker."""
    if not accepting.acquire(timeout=ACCEPT_LOCK_STUCK_S):
        logger.error("the dead gateway worker held the accept lock; releasing it")
    accepting.release()


def _failure_of(index: int, failures) -> str:
    """What the worker `index` reported before it exited, or where to look when it could not report."""
    reported = {}
    while not failures.empty():
        worker, error = failures.get()
        reported[worker] = error
    return reported.get(index, "its error is above (uvicorn's log, or Python's traceback)")


def _worker_main(index: int, sock: socket.socket, counts, served, failures, accepting, parent_pid: int, make_app,
                 log_level: str) -> None:
    try:
        config = uvicorn.Config(make_app(), log_level=log_level, timeout_graceful_shutdown=STOP_GRACE_S)
    except Exception as error:  # noqa: BLE001 - any error building the app: the parent stops the gateway with it
        failures.put((index, f"{type(error).__name__}: {error}"))
        sys.exit(1)
    BalancedServer(config, ConnectionBalancer(index, sock, counts, accepting), parent_pid, served).run()


class BalancedServer(uvicorn.Server):
    """uvicorn's server without a listener of its own: its startup runs the app's lifespan (`sockets=[]`),
    then its balancer takes connections from the shared socket; its shutdown closes them as uvicorn does."""

    def __init__(self, config, balancer: ConnectionBalancer, parent_pid: int, served):
        super().__init__(config)
        self.balancer, self.parent_pid, self.served = balancer, parent_pid, served

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=[])
        if not self.should_exit:
            self.balancer.start(self)
            self.served[self.balancer.index] = 1

    async def on_tick(self, counter: int) -> bool:
        self.balancer.publish()  # so that closed connections count off without waiting for a new one
        if os.getppid() != self.parent_pid:  # the parent died: nobody would stop or replace this worker
            self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets=None) -> None:
        self.balancer.stop()
        await super().shutdown(sockets=sockets)


class ConnectionBalancer:
    """Accepts a waiting connection for its worker only while no other worker has fewer open connections,
    and hands it to uvicorn's HTTP protocol, as uvicorn's own listener would."""

    def __init__(self, index: int, listener: socket.socket, counts, accepting):
        self.index, self.listener, self.counts = index, listener, counts
        self.accepting = accepting  # a lock shared by the workers: one checks the counts and accepts at a time
        self.server = None
        self.loop = None
        self.connecting = 0  # accepted, not yet in uvicorn's connections

    def start(self, server: uvicorn.Server) -> None:
        self.server, self.loop = server, asyncio.get_running_loop()
        self.counts[self.index] = 0
        self.loop.add_reader(self.listener.fileno(), self._on_waiting_connection)

    def stop(self) -> None:
        if self.loop is not None:
            self.loop.remove_reader(self.listener.fileno())
        self.counts[self.index] = NOT_SERVING

    def publish(self) -> None:
        if self.server is not None:
            self.counts[self.index] = self._open_connections()

    def _open_connections(self) -> int:
        return len(self.server.server_state.connections) + self.connecting

    def _protocol(self):
        server = self.server
        return server.config.http_protocol_class(config=server.config, server_state=server.server_state,
                                                 app_state=server.lifespan.state, _loop=self.loop)

    def _on_waiting_connection(self) -> None:
        if not self.accepting.acquire(block=False):
            return  # another worker is checking: the socket stays readable, so this one is called again
        try:
            connection = self._accept_if_least_loaded()
        finally:
            self.accepting.release()
        if connection is not None:
            self.loop.create_task(self._connect(connection))

    def _accept_if_least_loaded(self) -> socket.socket | None:
        mine = self._open_connections()
        self.counts[self.index] = mine
        if any(count < mine for other, count in enumerate(self.counts) if other != self.index):
            return None  # a less loaded worker takes it
        try:
            connection, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return None  # another worker took it first
        except OSError as error:  # e.g. out of file descriptors: pause, the connection stays for another worker
            logger.error("gateway worker %d could not accept a connection: %s", self.index, error)
            self.loop.remove_reader(self.listener.fileno())
            self.loop.call_later(ACCEPT_ERROR_PAUSE_S, self.loop.add_reader, self.listener.fileno(),
                                 self._on_waiting_connection)
            return None
        connection.setblocking(False)
        self.connecting += 1
        self.counts[self.index] = mine + 1
        return connection

    async def _connect(self, connection: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self._protocol, connection)
        except OSError:
            connection.close()
        finally:
            self.connecting -= 1
