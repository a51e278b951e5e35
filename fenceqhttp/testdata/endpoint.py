"""An HTTP endpoint for a fenceq HTTP kind, written with Python's standard library and
psycopg 3: the cross-language test of the fence (fenceqhttp's crosslang_test.go).

It checks each request's signature, then writes its result row and completes the job
with fenceq_complete(job_id, lease_gen) in one transaction, and answers 200 once that
transaction committed. A completion under a lease that is no longer held fails with
SQLSTATE QF002; the transaction, result row included, rolls back and it answers 409.

Environment: FENCEQ_DSN (a libpq connection string), FENCEQ_SCHEMA (the search path),
FENCEQ_HTTP_SECRET. With HOLD_FIRST=1 the first request waits, after its signature
check and before its transaction, until GET /release.

It prints one JSON line per event on stdout: {"event": "listening", "port": N} first,
then "held" (the first request waits), "committed" and "rejected" (with the SQLSTATE)
for each request's transaction, "unsigned" for a request whose signature is wrong, and
"bad deadline" for one whose Fenceq-Deadline is not an RFC 3339 time still ahead.
"""

import hashlib
import hmac
import json
import os
import sys
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg

DSN = os.environ["FENCEQ_DSN"]
SCHEMA = os.environ["FENCEQ_SCHEMA"]
SECRET = os.environ["FENCEQ_HTTP_SECRET"].encode()
HOLD_FIRST = os.environ.get("HOLD_FIRST") == "1"

release = threading.Event()
lock = threading.Lock()
calls = 0


def report(**event):
    with lock:
        print(json.dumps(event), flush=True)


def signature(job_id, lease_gen, body):
    """The Fenceq-Signature of a request: HMAC-SHA256 of "<job id>.<lease gen>.<body>"."""
    msg = f"{job_id}.{lease_gen}.".encode() + body
    return "sha256=" + hmac.new(SECRET, msg, hashlib.sha256).hexdigest()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body):
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())
        except OSError:
            pass  # the worker stopped waiting: its lease ended

    def do_GET(self):
        if self.path == "/release":
            release.set()
            self.answer(200, "released")
        else:
            self.answer(404, "not found")

    def do_POST(self):
        global calls
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        job_id = int(self.headers["Fenceq-Job-Id"])
        lease_gen = int(self.headers["Fenceq-Lease-Gen"])
        if not hmac.compare_digest(self.headers.get("Fenceq-Signature", ""), signature(job_id, lease_gen, body)):
            report(event="unsigned", job=job_id, gen=lease_gen)
            self.answer(401, "bad signature")
            return
        raw = self.headers.get("Fenceq-Deadline", "")
        try:
            deadline = datetime.fromisoformat(raw.replace("Z", "+00:00"))
            if deadline <= datetime.now(timezone.utc):
                raise ValueError("already passed")
        except ValueError as e:
            report(event="bad deadline", job=job_id, gen=lease_gen, error=f"Fenceq-Deadline {raw!r}: {e}")
        with lock:
            calls += 1
            first = calls == 1
        if first and HOLD_FIRST:
            report(event="held", job=job_id, gen=lease_gen)
            release.wait()
        args = json.loads(body)
        try:
            with psycopg.connect(DSN, options=f"-c search_path={SCHEMA}") as conn:
                with conn.transaction():
                    conn.execute(
                        "INSERT INTO results (job_id, lease_gen, n) VALUES (%s, %s, %s)",
                        (job_id, lease_gen, args["n"]),
                    )
                    conn.execute(
                        "SELECT fenceq_complete(%s, %s, %s::jsonb)",
                        (job_id, lease_gen, json.dumps({"by": "python", "gen": lease_gen})),
                    )
        except psycopg.Error as e:
            report(event="rejected", job=job_id, gen=lease_gen, sqlstate=e.sqlstate, error=str(e).strip())
            self.answer(409, "lease lost")
            return
        report(event="committed", job=job_id, gen=lease_gen)
        self.answer(200, {"ok": True})


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    report(event="listening", port=server.server_address[1])
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
