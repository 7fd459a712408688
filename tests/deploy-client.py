"""pensieve-serve replicas behind nginx (deploy/run-replicas), driven by
tests/test-deploy.sh. Conversations of several turns, each session's turns
one after the other and the sessions side by side, greedy and with the
answers' token ids:

1. Turns 0 and 1. Every turn of a session went to one replica (nginx's
   access log names the replica per request); that replica, and no other,
   holds the session (GET /v1/sessions/{id} on each replica directly) and
   its pensieve_sessions gauge counts them; a session's second turn found its
   first turn's tokens cached.
2. Turn 2, while one replica (the victim, the one with the most sessions)
   dies. It first decodes long answers for three sessions of its own
   (probes, outside the conversations) and is stopped (SIGSTOP) meanwhile;
   the conversations' turn 2 go out, the victim's sessions' reach it and
   wait unread in its sockets; then SIGKILL. nginx answers 502 to exactly
   the requests that were in flight on it (its error log confirms each had
   been sent) and 200 to every other; sent again, as a client retries a
   5xx, each is answered by a surviving replica.
3. Turns 3 and 4: each moved session stays on the one replica it moved to
   and finds its history cached there again; the other sessions never moved
   (only the dead replica's keys move). Exactly one live replica holds each
   session.
3b. A second replica is killed while idle: turn 5 of every session is
   answered 200 (nginx's connection to it is refused, and the request goes
   to the next replica on the ring), all on the last replica.
4. The same conversations against one pensieve-serve that never died: every
   answer's token ids are equal.

Only non-streamed requests here: a stream cut by the dead replica has had
its 200 and some tokens already, so nginx can only close the connection
before the final chunk: the client sees a truncated response with no
[DONE] (curl: "transfer closed with outstanding read data"), and must take
that as a failed turn and send it again whole.

Prints TAP lines numbered from --first; exits 1 on a failed check."""

import argparse
import concurrent.futures
import http.client
import json
import os
import re
import signal
import sys
import time
import traceback

from tap_client import Tap

SESSIONS = 9
TURNS = 6
SHORT = 6         # tokens of an ordinary answer
KILL_TURN = 2     # the turn in flight when the victim dies
IDLE_TURN = 5     # the turn after a second replica died idle
TIMEOUT = 30      # seconds for any one request


def request(port, method, path, body=None, headers=None):
    """(status, parsed JSON body or text) of one request to 127.0.0.1:port."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        data = json.dumps(body).encode() if body is not None else None
        h = {"Content-Type": "application/json"} if data else {}
        h.update(headers or {})
        conn.request(method, path, body=data, headers=h)
        resp = conn.getresponse()
        raw = resp.read().decode("utf-8", "replace")
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw
    finally:
        conn.close()


class Conversation:
    """One session's messages so far, and what each turn was answered."""

    def __init__(self, k):
        self.k = k
        self.sid = f"deploy-{k}"
        self.messages = [{"role": "system", "content": f"You are assistant number {k}."}]
        self.answers = {}    # turn -> token ids
        self.cached = {}     # turn -> usage.prompt_tokens_details.cached_tokens
        self.statuses = {}   # turn -> [HTTP status of each try]

    def body(self, turn, max_tokens):
        msgs = self.messages + [{"role": "user", "content": f"Question {turn} of conversation {self.k}: "
                                 f"what comes after {self.k * 7 + turn}?"}]
        return {"model": "pensieve", "messages": msgs, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True}

    def send(self, port, turn, max_tokens):
        """One try of a turn; on a 200 the answer joins the conversation."""
        body = self.body(turn, max_tokens)
        status, r = request(port, "POST", "/v1/chat/completions", body, {"X-Session-Id": self.sid})
        self.statuses.setdefault(turn, []).append(status)
        if status == 200:
            self.answers[turn] = r["choices"][0]["token_ids"]
            self.cached[turn] = ((r.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            self.messages = body["messages"] + [{"role": "assistant", "content": r["choices"][0]["message"]["content"]}]
        return status, r


def run_turns(pool, convs, port, turns):
    """The given turns of every conversation, sessions side by side."""
    def one(c):
        for t in turns:
            status, r = c.send(port, t, SHORT)
            if status != 200:
                return f"{c.sid} turn {t}: HTTP {status}: {str(r)[:300]}"
        return None
    return [e for e in pool.map(one, convs) if e]


def wait_stopped(pid):
    """Whether every thread of pid is stopped, within 5 s. SIGSTOP stops
    a process's threads one by one: the first to run stops the others, and
    on a busy machine the rest go on for a while meanwhile."""
    deadline = time.time() + 5
    while time.time() < deadline:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = []
        for t in tasks:
            try:
                with open(f"/proc/{pid}/task/{t}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass
        if states and all(st in ("T", "t") for st in states):
            return True
        time.sleep(0.005)
    return False


def open_connections_to(port):
    """Connections to 127.0.0.1:port not yet closed by their client
    (ESTABLISHED or CLOSE_WAIT in /proc/net/tcp)."""
    n = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if int(fields[2].split(":")[1], 16) == port and fields[3] in ("01", "08"):
                n += 1
    return n


def access_log(path):
    """[(session, method, uri, status, last upstream)] of nginx's log."""
    rows = []
    pat = re.compile(r'^\S+ (\S+) (\S+) (\d+) session="([^"]*)" upstream="([^"]*)"')
    with open(path) as f:
        for line in f:
            m = pat.match(line)
            if m:
                rows.append((m.group(4), m.group(1), m.group(2), int(m.group(3)),
                             m.group(5).split(",")[-1].strip()))
    return rows


def log_rows(path, want, start=0):
    """The access log's rows from start on, once want(rows) holds (nginx
    writes a row just after the response goes out: wait up to 5 s)."""
    deadline = time.time() + 5
    while True:
        rows = access_log(path)[start:]
        if want(rows) or time.time() > deadline:
            return rows
        time.sleep(0.02)


def gauge(port, name):
    status, text = request(port, "GET", "/metrics")
    for line in str(text).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not on :{port}/metrics (HTTP {status})")


def unread_requests(port):
    """Established TCP connections to 127.0.0.1:port with bytes not yet read
    by the server (/proc/net/tcp's rx_queue), i.e. requests it holds."""
    n = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local, state, queues = fields[1], fields[3], fields[4]
            if int(local.split(":")[1], 16) == port and state == "01" and int(queues.split(":")[1], 16) > 0:
                n += 1
    return n


def main(tap, args):
    url = open(os.path.join(args.dir, "url")).read().strip()
    port = int(url.rsplit(":", 1)[1])
    replicas = []
    k = 0
    while os.path.exists(os.path.join(args.dir, f"replica-{k}.port")):
        replicas.append((int(open(os.path.join(args.dir, f"replica-{k}.port")).readline()),
                         int(open(os.path.join(args.dir, f"replica-{k}.pid")).read())))
        k += 1
    addr = {f"127.0.0.1:{p}": i for i, (p, _) in enumerate(replicas)}
    log = os.path.join(args.dir, "nginx", "access.log")
    convs = [Conversation(k) for k in range(SESSIONS)]
    pool = concurrent.futures.ThreadPoolExecutor(SESSIONS + 4)
    victim_sessions = set()

    # ---- 1: turns 0 and 1 stick to one replica each ------------------------------------
    errors = run_turns(pool, convs, port, range(KILL_TURN))
    tap.ok(not errors, f"turns 0-{KILL_TURN - 1} of {SESSIONS} sessions through the balancer: all 200",
           "\n".join(errors))
    home = {}      # session -> replica index, from the access log
    chat = lambda rows: [r for r in rows if r[2] == "/v1/chat/completions"]
    rows = chat(log_rows(log, lambda rows: len(chat(rows)) >= SESSIONS * KILL_TURN))
    spread = {}
    for sid, _, _, _, up in rows:
        spread.setdefault(sid, set()).add(addr.get(up, up))
    tap.ok(len(rows) == SESSIONS * KILL_TURN and all(len(v) == 1 for v in spread.values()),
           "the access log shows every turn of a session on one replica",
           f"{len(rows)} rows; {spread}")
    home = {sid: min(v, key=str) for sid, v in spread.items()}
    per_replica = [sorted(s for s, h in home.items() if h == i) for i in range(len(replicas))]
    tap.ok(sum(1 for s in per_replica if s) >= 2, "the sessions are spread over more than one replica",
           str(per_replica))
    holders = {}
    for c in convs:
        holders[c.sid] = [i for i, (p, _) in enumerate(replicas)
                          if request(p, "GET", "/v1/sessions/" + c.sid)[0] == 200]
    tap.ok(all(holders[s] == [home.get(s)] for s in holders),
           "each session is held by the replica the log names and by no other (GET /v1/sessions on each)",
           f"holders {holders}, log {home}")
    counts = [gauge(p, "pensieve_sessions") for p, _ in replicas]
    tap.ok(counts == [len(s) for s in per_replica], "each replica's pensieve_sessions counts the sessions routed to it",
           f"/metrics {counts}, routed {[len(s) for s in per_replica]}")
    tap.ok(all(c.cached.get(1, 0) > 0 for c in convs),
           "every session's second turn found its first turn cached (usage.prompt_tokens_details.cached_tokens)",
           str({c.sid: c.cached for c in convs}))

    # ---- 2: kill -9 a replica mid-run ---------------------------------------------------
    # The victim first decodes long answers for three sessions of its own
    # (probes: single-turn sessions outside the conversations); once they
    # run it is stopped (SIGSTOP), the conversations' next turns are sent
    # (its sessions' turns reach it and wait, unanswered, in its socket
    # buffers: in flight for nginx and the clients), then it is killed.
    victim = max(range(len(replicas)), key=lambda i: (len(per_replica[i]), -i))
    victim_sessions.update(per_replica[victim])
    vport, vpid = replicas[victim]
    vaddr = f"127.0.0.1:{vport}"
    probes = []
    for j in range(200):
        pid_ = f"probe-{j}"
        request(port, "GET", "/v1/sessions/" + pid_)   # routed by the id in the path
        row = log_rows(log, lambda rows: any(r[0] == pid_ for r in rows))
        if [r[4] for r in row if r[0] == pid_] == [vaddr]:
            probes.append(pid_)
            if len(probes) == 3:
                break
    def probe(sid):
        body = {"model": "pensieve", "messages": [{"role": "user", "content": "Count to a thousand."}],
                "max_tokens": args.long, "temperature": 0, "ignore_eos": True}
        return request(port, "POST", "/v1/chat/completions", body, {"X-Session-Id": sid})
    mark = len(access_log(log))   # the rows from here on are the kill's and after
    probe_futs = [pool.submit(probe, sid) for sid in probes]
    running = 0
    deadline = time.time() + 10
    while time.time() < deadline and running < len(probes):
        running = gauge(vport, "pensieve_requests_running")
    os.kill(vpid, signal.SIGSTOP)
    stopped = wait_stopped(vpid)
    tap.ok(len(probes) == 3 and running >= 3 and stopped,
           f"replica {victim} (:{vport}) stopped while decoding {len(probes)} answers of {args.long} tokens "
           f"({int(running)} running)", f"probes {probes}, all threads stopped: {stopped}")
    futs = {c.sid: pool.submit(c.send, port, KILL_TURN, SHORT) for c in convs}
    held = 0
    deadline = time.time() + 10
    while time.time() < deadline and held < len(victim_sessions):
        time.sleep(0.02)
        held = unread_requests(vport)
    os.kill(vpid, signal.SIGKILL)
    tap.ok(held == len(victim_sessions),
           f"turn {KILL_TURN} of its {len(victim_sessions)} sessions reached it and waits unread "
           f"({held} requests in its sockets); then SIGKILL")
    results = {sid: f.result() for sid, f in futs.items()}
    probe_results = [f.result()[0] for f in probe_futs]
    bad = {sid: (st, str(r)[:200]) for sid, (st, r) in results.items()
           if (sid in victim_sessions) != (st == 502)}
    tap.ok(not bad, f"after SIGKILL, nginx answered 502 Bad Gateway to the {len(victim_sessions)} turns in flight "
           f"on the dead replica, 200 to every other turn", str(bad))
    # A probe that was answered before the stop was not in flight; the
    # others were cut mid-answer.
    tap.ok(all(st in (200, 502) for st in probe_results) and 502 in probe_results,
           f"the answers it was decoding got 502 ({probe_results.count(502)} of {len(probes)} cut mid-answer)",
           str(probe_results))
    # nginx's error log says what each 502 was: a request already sent to
    # the replica, whose connection then closed ("while reading response
    # header from upstream"), not one it could not send (which it would
    # have sent to the next replica instead).
    sent = 0
    with open(os.path.join(args.dir, "nginx", "error.log")) as f:
        for line in f:
            if "[error]" in line and "while reading response header from upstream" in line and f":{vport}/" in line:
                sent += 1
    n502 = sum(1 for st, _ in results.values() if st == 502) + probe_results.count(502)
    tap.ok(sent == n502, f"each 502 was a request the dead replica had been sent ({sent} in nginx's error log)",
           f"{n502} answered 502")
    retried = {}
    for c in convs:
        if c.sid in victim_sessions:
            retried[c.sid] = c.send(port, KILL_TURN, SHORT)[0]
    tap.ok(retried and all(st == 200 for st in retried.values()),
           "sent again, as a client retries a 5xx, each of its turns is answered (200)", str(retried))

    # ---- 3: the moved sessions settle on a survivor ------------------------------------
    errors = run_turns(pool, convs, port, range(KILL_TURN + 1, IDLE_TURN))
    tap.ok(not errors, f"turns {KILL_TURN + 1}-{IDLE_TURN - 1} of every session after the kill: all 200",
           "\n".join(errors))
    after = {}
    ok200 = lambda rows: [r for r in rows if r[0].startswith("deploy-") and r[3] == 200]
    for sid, _, uri, st, up in ok200(log_rows(log, lambda rows: len(ok200(rows)) >= SESSIONS * (IDLE_TURN - KILL_TURN),
                                              mark)):
        if uri == "/v1/chat/completions" and st == 200:
            after.setdefault(sid, set()).add(addr.get(up, up))
    moved_ok = all(len(after.get(s, ())) == 1 and victim not in after[s] for s in victim_sessions)
    tap.ok(moved_ok, "each of the dead replica's sessions moved to one surviving replica",
           str({s: after.get(s) for s in victim_sessions}))
    stayed = {s: after.get(s) for s in home if s not in victim_sessions and after.get(s) != {home[s]}}
    tap.ok(not stayed, "the other sessions stayed on their replica", str(stayed))
    tap.ok(all(c.cached.get(t, 0) > 0 for c in convs for t in range(KILL_TURN + 1, IDLE_TURN)),
           "after the move, later turns find their history cached again",
           str({c.sid: c.cached for c in convs}))
    holders = {}
    for c in convs:
        holders[c.sid] = [i for i, (p, _) in enumerate(replicas) if i != victim
                          and request(p, "GET", "/v1/sessions/" + c.sid)[0] == 200]
    tap.ok(all(len(h) == 1 for h in holders.values()) and
           all(set(holders[s]) == after.get(s) for s in holders),
           "each session is held by exactly one surviving replica, the one serving it", str(holders))

    # ---- 3b: a replica that dies idle costs no request ---------------------------------
    # Nothing is in flight on it, so nginx's connection to it is refused and
    # the request goes to the next replica on the ring (proxy_next_upstream).
    survivors = [i for i in range(len(replicas)) if i != victim]
    on = {i: [s for s in after if after[s] == {i}] for i in survivors}
    second = max(survivors, key=lambda i: (len(on[i]), -i))
    os.kill(replicas[second][1], signal.SIGKILL)
    # nginx keeps idle connections to it: let it see them closed first. A
    # request sent down one in the instant before that would get a 502
    # (sent, so not sent again), as with any connection that breaks.
    deadline = time.time() + 2
    while time.time() < deadline and open_connections_to(replicas[second][0]):
        time.sleep(0.02)
    mark = len(access_log(log))
    errors = run_turns(pool, convs, port, range(IDLE_TURN, TURNS))
    tap.ok(not errors and on[second],
           f"replica {second} killed while idle: turn {IDLE_TURN} of every session answered 200, "
           f"its {len(on[second])} sessions included", "\n".join(errors))
    last = [i for i in survivors if i != second][0]
    rows = ok200(log_rows(log, lambda rows: len(ok200(rows)) >= SESSIONS, mark))
    where = {sid: addr.get(up, up) for sid, _, _, _, up in rows}
    tap.ok(len(rows) == SESSIONS and all(where.get(c.sid) == last for c in convs),
           f"every session is now on the last replica, {last}", str(where))
    pool.shutdown()

    # ---- 4: the same conversations on one server that never died ----------------------
    ref = [Conversation(k) for k in range(SESSIONS)]
    pool = concurrent.futures.ThreadPoolExecutor(SESSIONS)
    errors = run_turns(pool, ref, args.ref_port, range(TURNS))
    pool.shutdown()
    tap.ok(not errors, "the reference run on one pensieve-serve: all 200", "\n".join(errors))
    diff = [(c.sid, t) for c, r in zip(convs, ref) for t in range(TURNS)
            if c.answers.get(t) != r.answers.get(t)]
    tap.ok(not diff, f"every answer's token ids equal the reference's ({SESSIONS * TURNS} turns, "
           f"{sum(len(a) for c in convs for a in c.answers.values())} tokens), moved sessions included",
           "differ: " + str(diff[:10]))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True, help="run-replicas --dir")
    ap.add_argument("--ref-port", type=int, required=True, help="the single reference server")
    ap.add_argument("--long", type=int, default=1800, help="tokens of the answers decoding at the kill")
    ap.add_argument("--first", type=int, default=1, help="the first test number (the caller prints the plan)")
    args = ap.parse_args()
    tap = Tap(args.first)
    try:
        main(tap, args)
    except Exception:
        tap.ok(False, "the client ran to its end", traceback.format_exc())
    sys.exit(1 if tap.failed else 0)
