"""The small TCP store on the master that hands rank 0's NCCL unique id to every rank.

Rank 0 listens on ``MASTER_PORT``; every other rank connects (retrying while rank 0
is not up yet) and sends one JSON line ``{"rank": r, "world_size": n}``.  Once all
``n - 1`` have checked in, rank 0 answers each with ``{"payload": <hex>}``; a rank that
claims another world size, or a rank number seen twice, is answered
``{"error": ...}`` and the store fails.  Every wait has a deadline, so a peer that never
arrives makes the others raise (naming the missing ranks) instead of hanging.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any


def share(payload: bytes | None, rank: int, world_size: int, addr: str, port: int, timeout: float) -> bytes:
    """Rank 0 gives ``payload``, every rank returns it."""
    deadline = time.monotonic() + timeout
    if rank == 0:
        _serve(payload or b"", world_size, port, deadline, timeout)
        return payload or b""
    return _join(rank, world_size, addr, port, deadline, timeout)


def _serve(payload: bytes, world_size: int, port: int, deadline: float, timeout: float) -> None:
    arrived: dict[int, socket.socket] = {}
    with socket.create_server(("", port), reuse_port=False) as server:
        try:
            while len(arrived) < world_size - 1:
                server.settimeout(max(deadline - time.monotonic(), 0.001))
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    missing = sorted(set(range(1, world_size)) - set(arrived))
                    raise RuntimeError(f"init: rank 0 waited {timeout:g} s at port {port} but rank(s) "
                                       f"{missing} of {world_size} never arrived") from None
                hello = _receive(conn, deadline, "a rank's hello")
                problem = _check(hello, world_size, arrived)
                if problem is not None:
                    _send(conn, {"error": problem})
                    conn.close()
                    raise ValueError(f"init: {problem}")
                arrived[hello["rank"]] = conn
            for conn in arrived.values():
                _send(conn, {"payload": payload.hex()})
        except BaseException as exc:
            for conn in arrived.values():
                _send(conn, {"error": f"rank 0 failed: {exc}"})
            raise
        finally:
            for conn in arrived.values():
                conn.close()


def _check(hello: Any, world_size: int, arrived: dict[int, socket.socket]) -> str | None:
    """Why rank 0 refuses a hello, or None."""
    if not isinstance(hello, dict) or not isinstance(hello.get("rank"), int):
        return f"a peer sent a malformed hello {hello!r}"
    rank, theirs = hello["rank"], hello.get("world_size")
    if theirs != world_size:
        return f"mismatched world sizes: rank {rank} has WORLD_SIZE={theirs}, rank 0 has {world_size}"
    if not 0 < rank < world_size or rank in arrived:
        return f"rank {rank} checked in twice or lies outside 1..{world_size - 1}"
    return None


def _join(rank: int, world_size: int, addr: str, port: int, deadline: float, timeout: float) -> bytes:
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=max(deadline - time.monotonic(), 0.001))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"init: rank {rank} could not reach rank 0 at {addr}:{port} within "
                                   f"{timeout:g} s") from None
            time.sleep(0.05)
    with conn:
        _send(conn, {"rank": rank, "world_size": world_size})
        reply = _receive(conn, deadline, f"rank 0's answer to rank {rank} (the other ranks did not all arrive "
                                         f"within {timeout:g} s)")
    if not isinstance(reply, dict) or "payload" not in reply:
        error = reply.get("error") if isinstance(reply, dict) else None
        raise ValueError(f"init: {error or f'rank 0 sent a malformed answer {reply!r}'}")
    return bytes.fromhex(reply["payload"])


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the peer has gone; its own deadline reports it


def _receive(conn: socket.socket, deadline: float, what: str) -> Any:
    """One JSON line from ``conn`` before ``deadline``."""
    data = b""
    while not data.endswith(b"\n"):
        conn.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            raise RuntimeError(f"init: timed out waiting for {what}") from None
        except OSError as exc:
            raise RuntimeError(f"init: the connection broke while waiting for {what}: {exc}") from None
        if not chunk:
            raise RuntimeError(f"init: the connection closed while waiting for {what}")
        data += chunk
    return json.loads(data)
