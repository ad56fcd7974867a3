"""TCPStore across processes, its server's robustness, binding and authentication.

Worker processes are forked (cheap on 2 cores); each rank of an ``mpiexec`` run
uses its own free port.
"""
import datetime
import logging
import multiprocessing
import os
import random
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from hpccomm.stores import free_port
from hpccomm.errors import DistNetworkError, DistStoreError
from hpccomm.stores import TCPStore, tcp
from hpccomm.stores._wire import Op, Status, decode_reply, encode_request, frame
from hpccomm.stores.tcp_server import parse_hello

CTX = multiprocessing.get_context("fork")


def _add_worker(port, n):
    store = TCPStore("127.0.0.1", port, 9, False, timeout=30)
    for _ in range(n):
        store.add("counter", 1)
    store.set(f"done/{os.getpid()}", "1")


def _get_worker(port, queue):
    store = TCPStore("127.0.0.1", port, timeout=30)
    queue.put(store.get("from_master"))  # blocks until the master sets it
    store.set("from_worker", "hello")


def test_add_from_8_processes_is_exact():
    master = TCPStore("127.0.0.1", 0, 9, True, timeout=30, wait_for_workers=False)
    procs = [CTX.Process(target=_add_worker, args=(master.port, 1000)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert master.add("counter", 0) == 8000
    assert len([k for k in master.list_keys() if k.startswith("done/")]) == 8
    master.close()


def test_cross_process_get_blocks_until_set():
    master = TCPStore("127.0.0.1", 0, None, True, timeout=30)
    queue = CTX.Queue()
    proc = CTX.Process(target=_get_worker, args=(master.port, queue))
    proc.start()
    time.sleep(0.2)
    master.set("from_master", "go")
    assert master.get("from_worker") == b"hello"
    assert queue.get(timeout=10) == b"go"
    proc.join(10)
    master.close()


def test_port_zero_binds_the_given_host_only():
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)
    assert store.port > 0 and store.host == "127.0.0.1"
    assert store._server.address == ("127.0.0.1", store.port)
    assert store.libuvBackend is False
    client = TCPStore("127.0.0.1", store.port, timeout=5)
    client.set("k", "v")
    assert store.get("k") == b"v"
    store.close()


def test_wait_for_workers_times_out_with_count():
    t0 = time.monotonic()
    with pytest.raises(DistStoreError, match=r"1/2 clients joined"):
        TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(milliseconds=300))
    assert time.monotonic() - t0 < 5


def test_world_size_join_counts_master_and_workers():
    master = TCPStore("127.0.0.1", 0, 2, True, timeout=10, wait_for_workers=False)
    TCPStore("127.0.0.1", master.port, 2, False, timeout=10)
    master.wait(["\0hpccomm/workers_all"], 5)  # internal key, hidden from users
    assert master.num_keys() == 0 and master.list_keys() == []
    master.close()


def test_multi_tenant_shares_one_server():
    a = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, timeout=5)
    b = TCPStore("127.0.0.1", a.port, is_master=True, multi_tenant=True, timeout=5)
    a.set("k", "shared")
    assert b.get("k") == b"shared"
    a.close()
    assert b.get("k") == b"shared"  # the server lives while a tenant remains
    b.close()
    with pytest.raises(DistNetworkError):
        TCPStore("127.0.0.1", a.port, timeout=0.3)


def test_second_master_on_busy_port_fails():
    a = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)
    with pytest.raises(DistNetworkError, match=f"^The server socket has failed to listen on "
                                               f"any local network address.*{a.port}"):
        TCPStore("127.0.0.1", a.port, is_master=True, timeout=5)
    a.close()


def test_connect_to_nothing_is_a_network_error():
    port = free_port("127.0.0.1")
    t0 = time.monotonic()
    with pytest.raises(DistNetworkError, match=r"timed out after 500ms while trying to "
                                               rf"connect to \(127.0.0.1, {port}\)"):
        TCPStore("127.0.0.1", port, timeout=0.5)
    assert time.monotonic() - t0 < 5


def test_clients_fail_cleanly_after_master_closes():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=2)
    client = TCPStore("127.0.0.1", master.port, timeout=0.5)
    client.set("k", "v")
    master.close()
    with pytest.raises((DistNetworkError, DistStoreError)):
        client.get("k")


def test_auth_accepts_the_secret_and_refuses_and_logs_others(caplog, monkeypatch):
    monkeypatch.delenv("HPCCOMM_STORE_TOKEN", raising=False)
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5, token="s3cret")
    master.set("k", "v")
    good = TCPStore("127.0.0.1", master.port, timeout=5, token=b"s3cret")
    assert good.get("k") == b"v"
    with caplog.at_level(logging.WARNING, logger="hpccomm.stores"):
        with pytest.raises(DistStoreError, match="requires a shared secret"):
            TCPStore("127.0.0.1", master.port, timeout=5)
        with pytest.raises(DistStoreError, match="refused"):
            TCPStore("127.0.0.1", master.port, timeout=5, token="wrong")
        time.sleep(0.1)
    assert any("authentication failed" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("HPCCOMM_STORE_TOKEN", "s3cret")
    from_env = TCPStore("127.0.0.1", master.port, timeout=5)
    assert from_env.get("k") == b"v"
    # a raw client that skips the handshake gets nothing and is dropped
    raw = socket.create_connection(("127.0.0.1", master.port))
    raw.sendall(frame(encode_request(Op.SET, [b"k", b"evil"])))
    raw.settimeout(5)
    data = b""
    while True:
        chunk = raw.recv(4096)
        if not chunk:
            break
        data += chunk
    (size,) = struct.unpack(">I", data[:4])
    assert len(data) == 4 + size  # only the hello challenge, never a reply
    assert parse_hello(data[4:])[0] is not None
    assert master.get("k") == b"v"
    master.close()


def _raw_reply(sock):
    head = b""
    while len(head) < 4:
        head += sock.recv(4 - len(head))
    (n,) = struct.unpack(">I", head)
    body = b""
    while len(body) < n:
        body += sock.recv(n - len(body))
    return decode_reply(body)


def _server_thread_cpu(store):
    tid = store._server._thread.native_id
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_server_sleeps_in_select_while_clients_wait():
    import threading

    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)
    waiter, errors = master.clone(), []

    def wait_in_thread():
        try:
            waiter.wait(["never"], 1.0)
        except DistStoreError as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait_in_thread)
    thread.start()
    raw = socket.create_connection(("127.0.0.1", master.port))
    raw.recv(64)  # hello
    raw.sendall(frame(encode_request(Op.WAIT, [b"never"], 1500)))
    before = _server_thread_cpu(master)
    status, fields = _raw_reply(raw)  # the server times the wait out itself
    assert status is Status.TIMEOUT and fields == [b"never"]
    assert _server_thread_cpu(master) - before < 0.1  # ~1.5 s of waiting, no spinning
    thread.join(5)
    assert len(errors) == 1 and "never" in str(errors[0])
    master.close()


def test_fuzzed_and_malformed_frames_never_hurt_the_server(caplog):
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=10)
    expected = {f"key{i}": os.urandom(16) for i in range(20)}
    for k, v in expected.items():
        master.set(k, v)
    master.add("ctr", 7)
    rng = random.Random(1234)
    valid = encode_request(Op.SET, [b"key0", b"clobbered"])
    bad_payloads = [
        b"",                                           # shorter than a header
        b"\x63" + b"\0" * 12,                          # unknown op
        encode_request(Op.SET, [b"only-key"]),         # wrong arity
        encode_request(Op.MULTI_SET, [b"a", b"b", b"c"]),
        valid[:-3],                                    # truncated field
        valid + b"junk",                               # trailing bytes
        struct.pack(">BqI", Op.WAIT, 0, 0xFFFFFFFF),   # absurd field count
    ]
    frames = [frame(p) for p in bad_payloads]
    frames.append(struct.pack(">I", 0xFFFFFFF0))      # oversized length prefix
    frames += [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200)))
               for _ in range(60)]                    # random garbage
    frames += [frame(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 80))))
               for _ in range(60)]                    # random payloads, well framed
    with caplog.at_level(logging.WARNING, logger="hpccomm.stores"):
        for data in frames:
            sock = socket.create_connection(("127.0.0.1", master.port))
            sock.recv(64)
            try:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(5)
                while sock.recv(4096):
                    pass
            except OSError:
                pass
            sock.close()
        # a half-sent frame left open must not block others
        dangling = socket.create_connection(("127.0.0.1", master.port))
        dangling.sendall(struct.pack(">I", 100) + b"partial")
        fresh = TCPStore("127.0.0.1", master.port, timeout=10)
        for k, v in expected.items():
            assert fresh.get(k) == v
        assert fresh.add("ctr", 0) == 7
        assert sorted(fresh.list_keys()) == sorted(list(expected) + ["ctr"])
        dangling.close()
    assert any("malformed request" in r.getMessage() for r in caplog.records)
    assert any("exceeds" in r.getMessage() for r in caplog.records)
    assert master._server._thread.is_alive()
    master.close()


def test_raw_protocol_matches_the_documentation():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)
    sock = socket.create_connection(("127.0.0.1", master.port))
    (n,) = struct.unpack(">I", sock.recv(4))
    hello = sock.recv(n)
    assert hello.startswith(b"HPCS2\x00")  # hello, no auth (+ the local socket's name)
    nonce, local = parse_hello(hello)
    assert nonce is None and (local.startswith(b"\0hpccomm-store-") or not local)
    sock.sendall(frame(encode_request(Op.ADD, [b"c", b"5"])))
    assert _raw_reply(sock) == (Status.OK, [b"5"])
    sock.sendall(frame(encode_request(Op.GET, [b"c"])))
    assert _raw_reply(sock) == (Status.OK, [b"5"])
    sock.sendall(frame(encode_request(Op.ADD, [b"c", b"x"])))
    status, fields = _raw_reply(sock)
    assert status is Status.ERROR and b"add" in fields[0]
    sock.close()
    master.close()


def _family(store):
    return store._client.sock.family


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix sockets")
def test_clients_on_this_host_move_to_the_local_socket(monkeypatch):
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)
    client = TCPStore("127.0.0.1", master.port, timeout=5)
    assert _family(master) == _family(client) == socket.AF_UNIX
    client.set("k", "v")
    assert master.get("k") == b"v"
    assert "remote=127.0.0.1:" in repr(client)
    monkeypatch.setenv("HPCCOMM_STORE_LOCAL_SOCKET", "0")  # read by new servers
    plain = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)
    assert _family(plain) == socket.AF_INET
    assert plain._server.local_name == b""
    plain.close()
    master.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix sockets")
def test_the_local_socket_demands_the_secret_too(monkeypatch):
    monkeypatch.delenv("HPCCOMM_STORE_TOKEN", raising=False)
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5, token="s3cret")
    assert _family(master) == socket.AF_UNIX
    master.set("k", "v")
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(master._server.local_name)
    raw.settimeout(5)
    (n,) = struct.unpack(">I", raw.recv(4))
    nonce, _ = parse_hello(raw.recv(n))
    assert nonce is not None  # challenged like a TCP client
    raw.sendall(frame(encode_request(Op.SET, [b"k", b"evil"])))
    while raw.recv(4096):
        pass  # closed without a reply
    assert master.get("k") == b"v"
    with pytest.raises(DistStoreError, match="refused"):
        TCPStore("127.0.0.1", master.port, timeout=5, token="wrong")
    master.close()


def test_constructor_arguments_are_checked_at_once():
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="TCPStore world size cannot be 0"):
        TCPStore("127.0.0.1", 1, world_size=0, is_master=False, timeout=30)
    for port in (-1, 70000):
        with pytest.raises(TypeError, match="port"):
            TCPStore("127.0.0.1", port, is_master=True)
    with pytest.raises(TypeError, match="port"):
        TCPStore("127.0.0.1", "29500", is_master=True)
    with pytest.raises(TypeError, match="host_name"):
        TCPStore(None, 0, is_master=True)
    with pytest.raises(TypeError, match="world_size"):
        TCPStore("127.0.0.1", 0, world_size="2", is_master=True)
    with pytest.raises(TypeError, match="is_master"):
        TCPStore("127.0.0.1", 0, is_master="yes")
    with pytest.raises(ValueError, match="negative"):
        TCPStore("127.0.0.1", 0, is_master=True, timeout=-1)
    assert time.monotonic() - t0 < 1  # none of them tried to connect


def test_a_finalizer_never_waits_for_the_server_registry():
    """A GC finalizer may run in a thread that holds the registry lock, or that another
    thread holding it waits for: releasing a server from one must defer, not block."""
    orphan = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)
    thread = orphan._server._thread
    with tcp._tenants_lock:  # as if another store were being registered right now
        finalizer = threading.Thread(target=orphan._finalizer)
        finalizer.start()
        finalizer.join(5)
        assert not finalizer.is_alive()  # it queued the release instead of blocking
        assert thread.is_alive()  # and nothing was released under the busy lock
    fresh = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)  # uses the registry
    thread.join(5)
    assert not thread.is_alive()  # the queued release ran once the lock was free
    fresh.close()


_START_DURING_GC = textwrap.dedent("""
    import gc, os, threading
    from hpccomm.stores import TCPStore

    def orphan():  # a master store only the garbage collector can free
        store = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, timeout=5)
        store.cycle = store
        return store._server._thread

    gc.disable()
    orphan_thread = orphan()
    real_start = threading.Thread.start

    def start(self):
        # The failure seen in the field: a collection (and so the orphan's finalizer)
        # runs in a thread that the thread starting the new server waits for.
        if self.name == "hpccomm-tcpstore" and not getattr(start, "done", False):
            start.done = True
            collector = threading.Thread(target=gc.collect)
            real_start(collector)
            collector.join(10)
            if collector.is_alive():
                print("deadlock: the finalizer waits for a lock the starter holds")
                os._exit(3)
        real_start(self)

    threading.Thread.start = start
    store = TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, timeout=5)
    store.set("k", "v")
    assert store.get("k") == b"v"
    orphan_thread.join(5)
    assert not orphan_thread.is_alive(), "the orphan's server was not stopped"
    print("ok")
""")


def test_a_finalizer_in_a_starting_server_thread_cannot_deadlock():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    proc = subprocess.run([sys.executable, "-c", _START_DURING_GC], capture_output=True,
                          text=True, timeout=60, env=env, cwd=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("ok")


def test_large_values_and_frames_split_anywhere():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=30)
    client = TCPStore("127.0.0.1", master.port, timeout=30)
    big = os.urandom(6 << 20)
    client.set("big", big)
    assert master.get("big") == big
    assert client.multi_get(["big", "big"]) == [big, big]
    # a raw client that sends its requests one byte at a time, two frames in one go
    raw = socket.create_connection(("127.0.0.1", master.port))
    raw.settimeout(10)
    (n,) = struct.unpack(">I", raw.recv(4))
    raw.recv(n)  # hello
    data = frame(encode_request(Op.SET, [b"k", b"v" * 100])) + frame(encode_request(Op.GET, [b"k"]))
    for i in range(len(data)):
        raw.sendall(data[i:i + 1])
        time.sleep(0.0005 if i < 8 else 0)  # split the length prefix for sure
    assert _raw_reply(raw) == (Status.OK, [])
    assert _raw_reply(raw) == (Status.OK, [b"v" * 100])
    raw.close()
    master.close()


def test_free_port_is_below_the_ephemeral_range_and_bindable():
    """A client's own source port is never below the ephemeral range, so a client that
    retries its connect before the server listens cannot connect to itself."""
    from hpccomm.stores.ports import ephemeral_range

    low, _ = ephemeral_range()
    ports = {free_port("127.0.0.1") for _ in range(8)}
    assert all(1024 <= port < low for port in ports), (ports, low)
    assert len(ports) > 1, ports  # drawn at random, not one fixed port for every job
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
