"""pensieve-serve against a hostile or careless client (issue 29, items
1-8; issue 28's namespaces of shared prefixes), over loopback on the
synthetic model. Each check names what a server
that got it wrong would show. Run by tests/test-serve-attack.sh:
    python3 serve-attack-client.py SERVE TMPDIR
Prints TAP."""

import hashlib
import hmac
import http.client
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap_client import Tap  # noqa: E402

SERVE, TMP = sys.argv[1], sys.argv[2]
KEY = "weak-key-1"
AUTH = {"Authorization": "Bearer " + KEY}
JSON = {"Content-Type": "application/json"}
MiB = 1 << 20
t = Tap(1)


class Server:
    count = 0

    def __init__(self, *args):
        Server.count += 1
        self.log = os.path.join(TMP, "server-%d.log" % Server.count)
        port_file = os.path.join(TMP, "port-%d" % Server.count)
        self.proc = subprocess.Popen([SERVE, "--synthetic", "--port", "0", "--port-file", port_file, *args],
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        self.port = None
        for _ in range(200):
            if os.path.exists(port_file):
                self.port = int(open(port_file).read().split()[0])
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)

    def rss(self):
        for line in open("/proc/%d/status" % self.proc.pid):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def log_text(self):
        return open(self.log, errors="replace").read()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def request(port, method, path, body=None, headers=None, timeout=30):
    """(status, body bytes); body may be a dict (sent as JSON)."""
    h = dict(headers or {})
    if isinstance(body, dict):
        body = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def chat(port, session, headers=None, extra=None):
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there " + session}], "max_tokens": 4,
            "temperature": 0}
    body.update(extra or {})
    h = dict(AUTH)
    h.update(headers or {})
    h.setdefault("X-Session-Id", session)
    return request(port, "POST", "/v1/chat/completions", body, h)


def raw(port, data, shut_wr=False, timeout=5.0):
    """Sends bytes on a fresh connection; returns what came back until the
    server closed or the timeout passed."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(timeout)
    s.sendall(data)
    if shut_wr:
        s.shutdown(socket.SHUT_WR)
    got = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
    except (socket.timeout, ConnectionResetError):
        pass
    s.close()
    return got


def status_of(resp):
    """The final status of raw response bytes, past any 1xx."""
    codes = [int(line.split()[1]) for line in resp.split(b"\r\n") if line.startswith(b"HTTP/1.")]
    finals = [c for c in codes if c >= 200]
    return finals[0] if finals else None


def close_wait_sockets(port):
    """Server-side sockets of `port` in CLOSE_WAIT (the client left, the
    server has not closed)."""
    n = 0
    for line in open("/proc/net/tcp").readlines()[1:]:
        f = line.split()
        if int(f[1].split(":")[1], 16) == port and f[3] == "08":
            n += 1
    return n


def peak_rss_during(srv, work):
    """Runs work() while sampling the server's resident memory; returns
    (peak growth in bytes, work's result)."""
    base, peak, done = srv.rss(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], srv.rss() - base)
            time.sleep(0.01)
    th = threading.Thread(target=sample)
    th.start()
    try:
        result = work()
    finally:
        done.set()
        th.join()
    return peak[0], result


def put_state_raw(port, length, send_bytes, auth):
    """A PUT /v1/session-states/x announcing `length` bytes: the headers,
    then up to send_bytes of zeros; returns (status or None, seconds to the
    answer, bytes the server took before it answered or closed)."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(20)
    head = "PUT /v1/session-states/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n" % length
    if auth:
        head += "Authorization: Bearer %s\r\n" % KEY
    t0 = time.time()
    s.sendall((head + "\r\n").encode())
    sent, chunk = 0, b"\0" * MiB
    s.setblocking(False)
    got = b""
    while sent < send_bytes:
        try:
            got += s.recv(65536)
            if got:
                break
        except BlockingIOError:
            pass
        except OSError:
            break
        try:
            sent += s.send(chunk[:min(len(chunk), send_bytes - sent)])
        except BlockingIOError:
            time.sleep(0.001)
        except OSError:
            break
    s.settimeout(20)
    try:
        while b"\r\n\r\n" not in got:
            b = s.recv(65536)
            if not b:
                break
            got += b
    except OSError:
        pass
    s.close()
    return status_of(got), time.time() - t0, sent


def fnv1a64(text):
    h = 0xcbf29ce484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def main():
    state_dir = os.path.join(TMP, "state")
    srv = Server("--api-key", KEY, "--max-sessions", "2", "--state-dir", state_dir, "--state-save-idle", "0",
                 "--http-timeout", "2", "--max-state-body", "512M")
    if not t.ok(srv.port is not None, "pensieve-serve starts with --api-key, --max-sessions 2, --state-dir",
                srv.log_text() if srv.port is None else ""):
        return
    port = srv.port

    # 1. Authentication and the body limit come before the body.
    st, secs, sent = put_state_raw(port, 200 * MiB, 0, auth=False)
    t.ok(st == 401 and secs < 2, "an unauthenticated PUT of 200 MiB is refused at its headers (%s in %.2f s, "
         "no body sent)" % (st, secs))
    grow, res = peak_rss_during(srv, lambda: [put_state_raw(port, 200 * MiB, 64 * MiB, auth=False)
                                              for _ in range(3)])
    t.ok(all(r[0] == 401 for r in res) and grow < 32 * MiB,
         "three unauthenticated 200 MiB PUTs: 401 each, the server grew %.1f MiB (each sent %s MiB before the "
         "refusal closed it)" % (grow / MiB, [round(r[2] / MiB, 1) for r in res]))
    st, secs, sent = put_state_raw(port, 600 * MiB, 0, auth=True)
    t.ok(st == 413 and secs < 2, "an authenticated PUT announcing 600 MiB past --max-state-body 512M: %s at "
         "its headers" % st)
    results = []

    def three_puts():
        ths = [threading.Thread(target=lambda: results.append(put_state_raw(port, 64 * MiB, 64 * MiB, True)))
               for _ in range(3)]
        [th.start() for th in ths]
        [th.join() for th in ths]
    grow, _ = peak_rss_during(srv, three_puts)
    t.ok(len(results) == 3 and all(r[0] == 400 for r in results) and grow < 48 * MiB,
         "three authenticated 64 MiB PUTs at once go to disk, not memory: %s, the server grew %.1f MiB"
         % ([r[0] for r in results], grow / MiB))

    # 2. --max-sessions holds for imports.
    ok_a = chat(port, "a")[0] == 200 and chat(port, "b")[0] == 200
    st, exported = request(port, "GET", "/v1/session-states/a", headers=AUTH)
    request(port, "DELETE", "/v1/sessions/a", headers=AUTH)
    ok_c = chat(port, "c")[0] == 200
    st_put, body = request(port, "PUT", "/v1/session-states/a", exported, AUTH)
    st_get = request(port, "GET", "/v1/sessions/a", headers=AUTH)[0]
    t.ok(ok_a and ok_c and st == 200 and st_put == 429 and b"too_many_sessions" in body and st_get == 404,
         "with 2 sessions held, a PUT of a third is 429 and creates nothing (PUT %d, then GET %d)"
         % (st_put, st_get))
    request(port, "DELETE", "/v1/sessions/b", headers=AUTH)
    st_put = request(port, "PUT", "/v1/session-states/a", exported, AUTH)[0]
    t.ok(st_put == 201, "with room again, the same PUT imports it (%d)" % st_put)

    # 4. A NUL in an id is refused, never cut short.
    before = json.loads(request(port, "GET", "/v1/sessions/a", headers=AUTH)[1]).get("tokens")
    st = request(port, "DELETE", "/v1/sessions/a%00def", headers=AUTH)[0]
    st_get, body = request(port, "GET", "/v1/sessions/a", headers=AUTH)
    t.ok(st == 400 and st_get == 200 and json.loads(body).get("tokens") == before,
         "DELETE /v1/sessions/a%%00def is 400 and session a keeps its %s tokens (%d, then GET %d)"
         % (before, st, st_get))
    st = request(port, "GET", "/v1/session-states/a%00", headers=AUTH)[0]
    t.ok(st == 400, "GET /v1/session-states/a%%00 is 400 (%d)" % st)
    # In a JSON body (session_id, prompt_cache_key) a NUL is \u0000, which
    # the parser refuses. (A raw NUL inside a header line cannot be seen
    # through libmicrohttpd 0.9.75, which ends the value there; nginx in
    # deploy/ refuses such lines: docs/serve.md.)
    codes = []
    for field in ("session_id", "prompt_cache_key"):
        st, _ = request(port, "POST", "/v1/chat/completions",
                        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                         field: "a\u0000def"}, AUTH)
        codes.append(st)
    after = json.loads(request(port, "GET", "/v1/sessions/a", headers=AUTH)[1]).get("tokens")
    t.ok(codes == [400, 400] and after == before,
         "session_id or prompt_cache_key with a NUL is 400 and session a is untouched (%s, %s -> %s tokens)"
         % (codes, before, after))

    # 6. Only JSON on JSON endpoints; on loopback, only our own Host names.
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    raw_body = json.dumps(body).encode()
    st_plain = request(port, "POST", "/v1/chat/completions", raw_body,
                       dict(AUTH, **{"Content-Type": "text/plain"}))[0]
    st_none = request(port, "POST", "/v1/chat/completions", raw_body, AUTH)[0]
    st_form = request(port, "POST", "/v1/completions", b'{"prompt":"x"}',
                      dict(AUTH, **{"Content-Type": "application/x-www-form-urlencoded"}))[0]
    st_json = request(port, "POST", "/v1/chat/completions", raw_body,
                      dict(AUTH, **{"Content-Type": "Application/JSON; charset=utf-8"}))[0]
    t.ok((st_plain, st_none, st_form, st_json) == (415, 415, 415, 200),
         "text/plain, no type, a form: 415; application/json with a charset: 200 (%d %d %d %d)"
         % (st_plain, st_none, st_form, st_json))
    codes = {}
    for host in ["evil.example", "evil.example:%d" % port, "localhost:%d" % port, "LOCALHOST.", "127.0.0.1:%d" % port,
                 "127.0.0.1.evil.example", "localhost:80x"]:
        codes[host] = status_of(raw(port, ("GET /health HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
                                           % host).encode()))
    want = {"evil.example": 403, "evil.example:%d" % port: 403, "localhost:%d" % port: 200, "LOCALHOST.": 200,
            "127.0.0.1:%d" % port: 200, "127.0.0.1.evil.example": 403, "localhost:80x": 403}
    t.ok(codes == want, "Host headers on a loopback server: %s" % codes)
    st = status_of(raw(port, ("GET /v1/session-states/a HTTP/1.1\r\nHost: rebound.example:%d\r\nAuthorization: "
                              "Bearer %s\r\nConnection: close\r\n\r\n" % (port, KEY)).encode()))
    t.ok(st == 403, "a rebound name cannot read a session's state (%s)" % st)

    # 8. A client that half-closes after its request gets its answer, also
    # one that takes longer than the watcher's look (0.1 s).
    msg = json.dumps(dict(body, max_tokens=1500, ignore_eos=True)).encode()
    t0 = time.time()
    resp = raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
               + KEY.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: "
               + str(len(msg)).encode() + b"\r\n\r\n" + msg, shut_wr=True)
    t.ok(status_of(resp) == 200 and b'"completion_tokens":1500' in resp,
         "a client that shuts its sending side after the request gets a 200 with the whole answer (%s, %.2f s)"
         % (status_of(resp), time.time() - t0))

    # 5. Clients that leave mid-body, or stall there, do not hold sockets.
    half = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + KEY.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n" + b'{"model":"m",' * 10)
    for _ in range(12):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(half)
        s.close()
    time.sleep(1.0)
    t.ok(close_wait_sockets(port) == 0,
         "12 clients that sent half a body and left: %d sockets in CLOSE_WAIT after 1 s" % close_wait_sockets(port))
    stalled = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(half)
        stalled.append(s)
    t0 = time.time()
    closed = 0
    for s in stalled:
        s.settimeout(max(0.1, 6 - (time.time() - t0)))
        try:
            closed += s.recv(1) == b""
        except ConnectionResetError:
            closed += 1
        except socket.timeout:
            pass
        s.close()
    t.ok(closed == 4, "4 clients stalled mid-body are closed by --http-timeout 2 (%d closed in %.1f s)"
         % (closed, time.time() - t0))

    # 3. Namespaces are keyed with the state directory's secret.
    rc = srv.stop()
    secret_path = os.path.join(state_dir, "secret")
    sb = os.stat(secret_path) if os.path.exists(secret_path) else None
    t.ok(rc == 0 and sb is not None and stat.S_IMODE(sb.st_mode) == 0o600 and sb.st_size == 32,
         "the state directory holds a 32-byte secret of mode 600 (%s)" % (oct(sb.st_mode) if sb else "absent"))
    names = [bytes.fromhex(f[:-4]).decode(errors="replace") for f in os.listdir(state_dir) if f.endswith(".pvs")]
    spaces = {n.split(":", 1)[0] for n in names}
    want_ns = hmac.new(open(secret_path, "rb").read(), KEY.encode(), hashlib.sha256).hexdigest()[:16] if sb else ""
    t.ok(len(names) >= 1 and spaces == {want_ns} and fnv1a64(KEY) not in spaces,
         "state file names carry HMAC-SHA256(secret, key), not a plain hash of the key (%s)" % sorted(spaces))
    t.ok(want_ns.encode() not in exported and b"a" in exported[96:97],
         "an exported state names the client's id only, no namespace")
    srv = Server("--api-key", KEY, "--state-dir", state_dir, "--state-save-idle", "0")
    st, body = chat(srv.port, "c") if srv.port else (None, b"{}")
    cached = json.loads(body).get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", 0) \
        if st == 200 else 0
    t.ok(st == 200 and cached > 0, "after a restart the key reaches its sessions again (%s cached)" % cached)
    srv.stop()

    # 7. Nothing in --state-dir blocks or misleads the start.
    odd = os.path.join(TMP, "odd-state")
    os.mkdir(odd, 0o700)
    os.mkfifo(os.path.join(odd, "6669666f.pvs"))
    os.symlink("/etc/passwd", os.path.join(odd, "6c696e6b.pvs"))
    t0 = time.time()
    srv = Server("--state-dir", odd, "--allowed-host", "proxy.example")
    log = srv.log_text()
    t.ok(srv.port is not None and time.time() - t0 < 10 and log.count("not a regular file") == 2,
         "a FIFO and a symlink named *.pvs are skipped with a warning; the server starts in %.1f s"
         % (time.time() - t0), log)
    if srv.port:
        a = status_of(raw(srv.port, b"GET /health HTTP/1.1\r\nHost: proxy.example\r\nConnection: close\r\n\r\n"))
        b = status_of(raw(srv.port, b"GET /health HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"))
        t.ok((a, b) == (200, 403), "--allowed-host proxy.example lets that name in, no other (%s, %s)" % (a, b))
    srv.stop()


def shared_prefixes():
    """Issue 28: sessions of one key share a common system prompt's chunks;
    another key's never do (a cache-timing side channel otherwise)."""
    keys = os.path.join(TMP, "share-keys")
    with open(keys, "w") as f:
        f.write("key-one\nkey-two\n")
    system = " ".join("rule %d: answer briefly and kindly." % i for i in range(40))

    def turn(port, key, session):
        body = {"model": "m", "max_tokens": 2, "temperature": 0,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": session}]}
        st, data = request(port, "POST", "/v1/chat/completions", body,
                           {"Authorization": "Bearer " + key, "X-Session-Id": session})
        usage = json.loads(data).get("usage", {}) if st == 200 else {}
        return usage.get("prompt_tokens_details", {}).get("cached_tokens"), usage.get("prompt_tokens")

    def shared_chunks(port, key, session):
        st, data = request(port, "GET", "/v1/sessions/" + session, headers={"Authorization": "Bearer " + key})
        j = json.loads(data) if st == 200 else {}
        return j.get("shared_chunks"), sum(1 for c in j.get("chunks", []) if c.get("shared"))

    srv = Server("--api-keys", keys)
    if not t.ok(srv.port is not None, "pensieve-serve starts with two API keys", srv.log_text()):
        return
    port = srv.port
    first = turn(port, "key-one", "p")
    second = turn(port, "key-one", "q")
    other = turn(port, "key-two", "r")
    t.ok(first[0] == 0 and second[0] and second[0] >= 64 and other[0] == 0,
         "the same system prompt: key one's second session reads %s of %s prompt tokens from the first's "
         "chunks; key two's first session none (%s)" % (second[0], second[1], other[0]))
    q, r = shared_chunks(port, "key-one", "q"), shared_chunks(port, "key-two", "r")
    t.ok(q[0] and q[0] == q[1] and r == (0, 0),
         "GET /v1/sessions marks the shared chunks: key one's q %s (%s marked), key two's r %s" % (q[0], q[1], r))
    metrics = request(port, "GET", "/metrics", headers={"Authorization": "Bearer key-one"})[1].decode()
    line = [x for x in metrics.splitlines() if x.startswith("pensieve_cache_shared_chunks ")]
    t.ok(line and int(line[0].split()[1]) == q[0], "/metrics counts the shared chunks: %s" % line)
    srv.stop()
    srv = Server("--api-keys", keys, "--no-prefix-sharing")
    if srv.port:
        turn(srv.port, "key-one", "p")
        again = turn(srv.port, "key-one", "q")
        t.ok(again[0] == 0, "--no-prefix-sharing: the second session reads nothing of the first's (%s)" % again[0])
    srv.stop()


try:
    main()
    shared_prefixes()
except Exception:
    t.error("the attack client raised")
print("1..%d" % t.n)
sys.exit(1 if t.failed else 0)
