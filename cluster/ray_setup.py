"""Start or join Ray, and describe its nodes.

Three ways in: inside a Ray job (``ray job submit`` sets ``RAY_ADDRESS``) or with ``--ray-address`` we
join the cluster; otherwise we start a local one. A local Ray started here keeps Ray's default token
authentication (``RAY_AUTH_MODE`` unset: a token is made in ``~/.ray/auth_token``); tests and ``make``
opt out with ``RAY_AUTH_MODE=disabled``. The dashboard stays off locally (it costs memory and a port).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Iterator

from cluster import raylet_watch
from graphs.errors import PlacerError, first_line

CONNECT_TIMEOUT_S = 10.0  # to open a TCP connection to a cluster's address before Ray tries (for minutes)
# How long a local Ray's start waits for its control store to write its port file (Ray's default: 30 s). The first
# start in a fresh environment on a loaded 2-core machine took longer ("Timed out waiting for file
# .../gcs_server_port_..."), and the command failed with a traceback; a user's own setting is kept.
GCS_PORT_WAIT_S = "120"
LOCAL_START_ATTEMPTS = 2  # a local start that timed out is tried once more (_start_local_ray)
_START_TIMEOUTS = ("timed out waiting for file", "timed out during startup")  # Ray's words for a start that hung


@dataclass(frozen=True)
class NodeInfo:
    node_id: str  # Ray's hex node id
    alive: bool
    num_cpus: float
    num_gpus: int
    labels: dict = field(default_factory=dict, compare=False)  # str -> str, including ray.io/node-id

    def has_labels(self, wanted: dict) -> bool:
        return all(self.labels.get(key) == value for key, value in wanted.items())


def init_ray(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None,
             namespace: str = "placer") -> str:
    """Connect to Ray (joining ``address`` or RAY_ADDRESS, else starting a local Ray); returns the GCS address.

    Does nothing but return the address when Ray is already initialized in this process.
    """
    import ray

    if ray.is_initialized():
        return ray.get_runtime_context().gcs_address
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        check_reachable(address)
    from cluster.jobs.interrupts import interrupts_deferred

    before_ray = signal.getsignal(signal.SIGTERM)  # ray.init sets its own handler
    try:
        # Ctrl-C and SIGTERM wait for ray.init: a Ctrl-C inside it left its processes running (a raylet and a
        # control store, started before Ray knew of them) and could end the process with a segfault at exit;
        # a SIGTERM met Ray's own handler and ended it at once, status 15, without the command's output
        with interrupts_deferred("stopping once Ray has started", (signal.SIGINT, signal.SIGTERM)) as held, \
                _no_ray_sigterm_handler():
            if address:  # warnings only, as below: Ray's "Connected to Ray cluster." came before a refusal
                ray.init(address=address, namespace=namespace, log_to_driver=True, logging_level=logging.WARNING)
            else:
                _start_local_ray(num_cpus, num_gpus, namespace, held)
    except ConnectionError as exc:  # a port that answers (check_reachable) but a handshake that fails
        no_cluster = "could not find any running ray instance" in str(exc).lower()  # address "auto"
        client = str(address).startswith("ray://")  # Ray Client's timeout says nothing of tokens
        hint = ("; a cluster with token authentication needs RAY_AUTH_MODE=token and its token in RAY_AUTH_TOKEN "
                "or ~/.ray/auth_token" if os.environ.get("RAY_AUTH_MODE") != "token" and not no_cluster
                and not client else "")
        raise PlacerError(f"cannot reach the Ray cluster at {address!r}: {_outer_and_inner_lines(exc)}{hint}") from exc
    except PlacerError:
        raise
    except Exception as exc:
        if "auth" in str(exc).lower() or "token" in str(exc).lower():
            raise PlacerError(f"Ray refused the connection ({exc}); a cluster with token authentication needs its "
                              f"token in RAY_AUTH_TOKEN or ~/.ray/auth_token") from exc
        raise
    _stop_on_sigterm(before_ray)
    raylet_watch.start()
    if held.pressed:
        shutdown_ray()
        raise KeyboardInterrupt
    return ray.get_runtime_context().gcs_address


def _outer_and_inner_lines(error: Exception) -> str:
    """A message of one line as it is; of several (a Ray Client server's "Initialization failure from
    server:" and its traceback), its first and last lines, which say what failed."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return " ".join(lines[:1] + lines[-1:]) if len(lines) > 1 else str(error)


def _start_local_ray(num_cpus: int | None, num_gpus: int | None, namespace: str, held) -> None:
    """Start a local Ray, once more if its start timed out. Now and then a process Ray started never came
    up (a control store that wrote no port file, not even its log, in 120 s; a raylet that never registered):
    in 3 of 4 fresh-clone test runs on one day, each time in a process that had started and stopped Ray
    before; the second start came up at once. What the failed start left running is stopped first. Nothing
    is printed: a command's stderr is its one error line, or nothing. ``held``: a Ctrl-C during the first start
    means no second one."""
    import ray

    # "local": a plain ray.init() would join whatever cluster /tmp/ray/ray_current_cluster names.
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", GCS_PORT_WAIT_S)
    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        children_before = _ray_children()
        try:
            # Warnings only: Ray's "Started a local Ray instance." on stderr preceded a refused command's
            # one error line (a real measurer and no GPU node), and says nothing with the dashboard off.
            ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, namespace=namespace,
                     include_dashboard=False, logging_level=logging.WARNING)
            return
        except Exception as exc:
            if not _start_timed_out(exc):
                raise
            ray.shutdown()
            _stop_process_trees(_ray_children() - children_before)
            if held.pressed:  # a Ctrl-C while it started: stop as one does
                raise KeyboardInterrupt from exc
            if attempt == LOCAL_START_ATTEMPTS:
                raise PlacerError(f"the local Ray did not start ({attempt} tries): {first_line(exc)}") from exc


def _start_timed_out(error: Exception) -> bool:
    return any(words in str(error).lower() for words in _START_TIMEOUTS)


def _ray_children() -> set:
    """This process's children that a Ray start makes (psutil.Process objects: a pid with its start time, so a
    reused pid is another process): Ray's programs (control store, raylet, reaper), and copies of this process
    not yet running theirs (forked, not yet exec'd: where a start hangs). Other children are no business of it."""
    import psutil

    me = psutil.Process()
    own = me.cmdline()
    found = set()
    for child in me.children():
        with suppress(psutil.Error):
            command = child.cmdline()
            if command == own or any("ray" in part for part in command):
                found.add(child)
    return found


def _stop_process_trees(processes: set) -> None:
    import psutil

    tree = set(processes)
    for process in processes:
        with suppress(psutil.Error):
            tree.update(process.children(recursive=True))
    for process in tree:
        with suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(list(tree), timeout=10)


@contextmanager
def _no_ray_sigterm_handler() -> Iterator[None]:
    """ray.init sets SIGTERM handlers of its own while it starts (exit at once); ``_stop_on_sigterm`` replaces
    them once it has returned, so within this block they are not set at all (Ray's one helper for it,
    ``ray._private.utils.set_sigterm_handler``, does nothing here; a Ray without it is left as it is).

    Nor does the driver's core worker install its failure signal handler (Abseil's, for SIGTERM among
    others): ray.shutdown uninstalls it by setting SIGTERM's action in the kernel back to the default, behind
    Python's back, and a SIGTERM in the second or so before ``shutdown_ray`` set the handler again ended the
    process with status 143, no output and no ``result.json``. Ray's workers and daemons keep theirs; the
    driver loses only the handler's stack dump on a crash of its own."""
    with _patched("ray._private.utils", "set_sigterm_handler", lambda handler: None), \
            _patched("ray._private.ray_constants", "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", True):  # read when the
        yield  # driver's core worker is made


@contextmanager
def _patched(module_name: str, name: str, value) -> Iterator[None]:
    """``module.name`` set to ``value`` while the block runs, where the module has it (each of Ray's
    internals on its own: a Ray without one still gets the other)."""
    import importlib

    try:
        module = importlib.import_module(module_name)
        original = getattr(module, name)
    except (ImportError, AttributeError):
        yield
        return
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


_SIGTERM_BEFORE: list = []  # the handler before ray.init, put back by shutdown_ray


def _stop_on_sigterm(before_ray) -> None:
    """SIGTERM (what `ray job stop` sends a job's driver) stops a run as Ctrl-C does: the log flushed, the
    learner's checkpoint kept, exit 130. Ray's own handler, set by ray.init, dumped a stack and lost both.
    ``before_ray``: the handler ray.init replaced, which shutdown_ray puts back (not Ray's: with no Ray, its
    ``sys.exit`` ended a search waiting for its bound with status 15 and no result)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _SIGTERM_BEFORE.append(before_ray)
    signal.signal(signal.SIGTERM, _raise_interrupt)


def _raise_interrupt(signum, frame) -> None:
    """SIGTERM as Ctrl-C: where a block holds Ctrl-C with a handler of its own (a HiGHS solve stopping at its
    next check, a closing that must finish), SIGTERM is held the same way; a KeyboardInterrupt raised inside
    HiGHS's callback was its "solve error", and the command went on to finish with status 0."""
    ctrl_c = signal.getsignal(signal.SIGINT)
    if callable(ctrl_c) and ctrl_c is not signal.default_int_handler:
        ctrl_c(signal.SIGINT, frame)
        return
    raise KeyboardInterrupt("stopped by SIGTERM")


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt as Ctrl-C does, whether Ray is up or not (a search
    waits for its proven bound after Ray is shut down); the handler before comes back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    if before is signal.SIG_IGN:  # ignored by the parent: it stays so, as a SIGINT does
        yield
        return
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A ``host:port`` address (also ``ray://host:port``) must accept a TCP connection within ``timeout_s``
    and must not answer as a web server: Ray itself retries an unreachable control store, or one that is
    no Ray, for minutes. "auto" is Ray's to resolve; any other form is refused. An http(s) address, or a
    port that answers HTTP, is a dashboard's, which `ray job submit` takes, not a cluster placer can join."""
    join = "placer joins the cluster at HOST:6379, or runs as a job, where Ray sets RAY_ADDRESS itself"
    if address.startswith(("http://", "https://")):
        raise PlacerError(f"{address!r} is a dashboard address (what `ray job submit --address` takes); {join}")
    if address == "auto":
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not host:  # int() refuses "²"
        raise PlacerError(f"Ray address {address!r} is not HOST:PORT (the head node's GCS port, 6379 by default), "
                          "ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as connection:
            answers_http = _answers_http(connection)
    except OSError as exc:
        raise PlacerError(f"cannot reach the Ray cluster at {address!r}: {exc.strerror or exc}") from None
    if answers_http:
        raise PlacerError(f"{address!r} answers HTTP, as a dashboard does, not Ray's control store; {join}")
    if address.startswith("ray://"):  # Ray Client's port speaks its own protocol
        check_not_control_store(address, timeout_s)
    else:
        check_token_accepted(address, timeout_s)


def check_not_control_store(client_address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A ``ray://`` address on a control store's port is one PlacerError saying which port to give: Ray Client
    waited 30 s there, then blamed a timeout (with a hint about tokens that did not apply). A port that
    answers the control store's call, or refuses it for want of a token, is a control store's; any other
    answer (a Ray Client server's UNIMPLEMENTED) is left to ray.init."""
    try:
        import grpc
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:
        return
    channel = init_grpc_channel(client_address.removeprefix("ray://"))
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(gcs_service_pb2.GetClusterIdRequest(),
                                                                           timeout=timeout_s)
        control_store = True
    except grpc.RpcError as exc:
        control_store = exc.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
    if control_store:
        raise PlacerError(f"{client_address!r} is a Ray control store's port, not Ray Client's: give it without "
                          f"ray:// ({client_address.removeprefix('ray://')}), or Ray Client's port, 10001 by default")


def check_token_accepted(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """One call to the control store at ``address``, sent as ray.init would send it (the token only with
    RAY_AUTH_MODE=token): a cluster that refuses it is one PlacerError saying why, within a second. ray.init
    retried the refused handshake for 20 s, printing a warning a second, then said the cluster was
    unreachable. A port that takes the connection and then answers no such call (silence, another gRPC
    service such as a raylet's) is refused too: ray.init waited on it for minutes, deaf to Ctrl-C and SIGTERM
    inside Ray's C++ client; so is one that speaks no gRPC at all (an SSH port: UNAVAILABLE, asked
    UNAVAILABLE_TRIES times). Any other answer (or a Ray without these internals) is left to ray.init."""
    try:
        import grpc
        from ray._private.authentication.authentication_utils import is_token_auth_enabled
        from ray._private.grpc_utils import init_grpc_channel
        from ray._raylet import AuthenticationTokenLoader
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:
        return
    sends_token = is_token_auth_enabled()
    if sends_token and not _has_token(AuthenticationTokenLoader.instance()):
        raise PlacerError(f"RAY_AUTH_MODE=token, but no Ray token was found to join {address!r}: put the cluster's "
                          f"token in RAY_AUTH_TOKEN or ~/.ray/auth_token (or its file's path in RAY_AUTH_TOKEN_PATH)")
    for attempt in range(UNAVAILABLE_TRIES):
        channel = init_grpc_channel(address)
        try:
            stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s)
            return
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNAUTHENTICATED:
                raise PlacerError(_refusal(address, sends_token)) from None
            refused = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED)
            if code in refused or (code == grpc.StatusCode.UNAVAILABLE and attempt == UNAVAILABLE_TRIES - 1):
                raise PlacerError(f"{address!r} accepts connections but does not answer as a Ray control store "
                                  f"(gRPC {code.name} within {timeout_s:g} s): give the head node's GCS port, "
                                  "6379 by default") from None
            if code != grpc.StatusCode.UNAVAILABLE:
                return
        finally:
            channel.close()
        time.sleep(UNAVAILABLE_PAUSE_S)


UNAVAILABLE_TRIES, UNAVAILABLE_PAUSE_S = 3, 0.5
"""gRPC UNAVAILABLE from a port that took the TCP connection: a service that speaks no HTTP/2 (an SSH server's
banner) or closes at once. ray.init retried such a port for about 12 minutes, deaf to SIGTERM; asked again a
few times (a control store that dropped one connection answers the next), it is refused."""


def _has_token(loader) -> bool:
    try:
        return bool(loader.has_token())
    except Exception:  # ray.exceptions.AuthenticationError: token mode, and no token anywhere
        return False


def _refusal(address: str, sent_token: bool) -> str:
    refused = f"the Ray cluster at {address!r} refused this client"
    if not sent_token:
        return (f"{refused}: it uses token authentication; export RAY_AUTH_MODE=token, with the cluster's token in "
                "RAY_AUTH_TOKEN or ~/.ray/auth_token")
    return (f"{refused}'s token (from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token): it is not the "
            "cluster's; use the head node's ~/.ray/auth_token")


def _answers_http(connection: socket.socket, timeout_s: float = 2.0) -> bool:
    """Whether the server behind ``connection`` replies to an HTTP/1.0 request as a web server does (Ray's
    GCS and client server speak gRPC: they close the connection, or send HTTP/2 frames, or nothing)."""
    connection.settimeout(timeout_s)
    try:
        connection.sendall(b"GET / HTTP/1.0\r\n\r\n")
        return connection.recv(8).startswith(b"HTTP/1.")
    except OSError:  # reset, timed out: not a web server
        return False


def shutdown_ray() -> None:
    import ray

    raylet_watch.stop()
    if ray.is_initialized():
        ray.shutdown()
    if _SIGTERM_BEFORE and threading.current_thread() is threading.main_thread():
        before_ray = _SIGTERM_BEFORE.pop()
        if signal.getsignal(signal.SIGTERM) is _raise_interrupt:  # else a block holds it (interrupts_deferred)
            signal.signal(signal.SIGTERM, before_ray if before_ray is not None else signal.SIG_DFL)


def list_nodes(alive_only: bool = True) -> list[NodeInfo]:
    """Nodes of the connected cluster, from Ray's control store."""
    import ray

    nodes = []
    for node in ray.nodes():
        resources = node.get("Resources", {})
        info = NodeInfo(node_id=node["NodeID"], alive=bool(node["Alive"]), num_cpus=float(resources.get("CPU", 0)),
                        num_gpus=int(resources.get("GPU", 0)), labels=dict(node.get("Labels") or {}))
        if info.alive or not alive_only:
            nodes.append(info)
    return nodes


def node_alive(node_id: str) -> bool:
    return any(node.node_id == node_id for node in list_nodes(alive_only=True))


MEASURER_LABELS = {"placer/role": "measurer"}  # what ray_config.yaml labels its GPU workers


def gpu_nodes(labels: dict | None = None, min_gpus: int = 1) -> list[NodeInfo]:
    """Alive nodes with at least ``min_gpus`` GPUs (at least one), and every label in ``labels``."""
    return [n for n in list_nodes() if n.num_gpus >= max(min_gpus, 1) and n.has_labels(labels or {})]
