#!/usr/bin/python3
"""An application and an external sender, as a developer writes them with
psycopg2 (Debian's python3-psycopg2), for t/070_driver_psycopg2.pl.

It connects as the README's enqueue role and worker role and passes every
value as a plain psycopg2 parameter (%s), with no cast in the SQL: strings
reach the server as untyped literals and empty lists as '{}', as in any
application.  Each step prints one line, "step: key=value ...", which the
Perl test reads; any error ends the program with a traceback and status 1.

    driver_app.py --host H --port P --dbname D [--mails N]
"""

import argparse
import io
import select
import sys
import time

import psycopg2

QUEUE = "drv"  # the COPY's mail, drained by the sender loop
LATER = "drv_later"  # mail with dedupe keys, due far ahead
NOTIFY = "drv_notify"  # a queue created with notify => true
QUIET = "drv_quiet"  # one created without
BATCH = 1000

# recipients of the COPY whose relay answers are scripted: every 1000th
# mailbox does not exist (a permanent refusal), every 1000th + 500 is busy
# (a retry); every other mail is sent
BOUNCE = "550 5.1.1 <{}>: no such user"
BUSY = "451 4.3.0 try again later"


def recipient(i):
    if i % 1000 == 0:
        return "bounce%d@drivers.example" % i
    if i % 1000 == 500:
        return "busy%d@drivers.example" % i
    return "u%d@drivers.example" % i


def connect(args, user):
    return psycopg2.connect(host=args.host, port=args.port, dbname=args.dbname, user=user)


def say(step, **values):
    print("%s: %s" % (step, " ".join("%s=%s" % kv for kv in values.items())), flush=True)


def step_rollback(args, app):
    """Enqueue inside the application's transaction, then roll it back:
    the mail never existed."""
    with app.cursor() as cur:
        cur.execute("SELECT gatekeeper.enqueue(%s, %s, %s, %s)",
                    ("rolledback@drivers.example", "Your order", "Hello", QUEUE))
        mail_id = cur.fetchone()[0]
    app.rollback()
    with app.cursor() as cur:
        cur.execute("SELECT count(*) FROM gatekeeper.status(%s)", (mail_id,))
        rows = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM gatekeeper.history(%s)", ("rolledback@drivers.example",))
        history = cur.fetchone()[0]
    app.commit()
    say("rollback", got_id=mail_id is not None, status_rows=rows, history_rows=history)


def step_copy(args, app):
    """COPY the mails in, as from an export (copy_expert)."""
    data = io.StringIO()
    for i in range(1, args.mails + 1):
        data.write("%s\tHello %d\tBody of mail %d\t%s\n" % (recipient(i), i, i, QUEUE))
    data.seek(0)
    with app.cursor() as cur:
        cur.copy_expert("COPY gatekeeper.mail (recipient, subject, body, queue) FROM STDIN", data)
        copied = cur.rowcount
    app.commit()
    say("copy", rows=copied)


def step_enqueue_keys(args, app):
    """Enqueue with the application's own keys; a second enqueue of a key
    returns the same mail."""
    ids = {}
    with app.cursor() as cur:
        for key in ("order-1", "order-2", "order-3"):
            cur.execute("SELECT gatekeeper.enqueue(%s, %s, %s, %s, %s, dedupe_key => %s)",
                        ("%s@drivers.example" % key, "Receipt " + key, "Thanks", LATER,
                         "2099-01-01 00:00:00+00", key))
            ids[key] = cur.fetchone()[0]
        cur.execute("SELECT gatekeeper.enqueue(%s, %s, %s, %s, %s, dedupe_key => %s)",
                    ("order-1@drivers.example", "Receipt again", "Thanks", LATER,
                     "2099-01-01 00:00:00+00", "order-1"))
        again = cur.fetchone()[0]
    app.commit()
    say("enqueue_keys", mails=len(set(ids.values())), deduplicated=(again == ids["order-1"]))
    return ids


def step_sender(args, worker):
    """The sender loop: claim, "deliver", report with ack_batch and
    nack_batch, every round sending all three calls, empty or not, until a
    claim takes nothing."""
    with worker.cursor() as cur:
        # what every sender loop sends when a batch had no failures
        cur.execute("SELECT gatekeeper.ack_batch(%s, %s)", ([], []))
        empty_ack = cur.fetchone()[0]
        cur.execute("SELECT gatekeeper.nack_batch(%s, %s, %s)", ([], [], []))
        empty_nack = cur.fetchone()[0]
        cur.execute("SELECT gatekeeper.nack_batch(%s, %s, %s, %s)", ([], [], [], True))
        empty_nack_permanent = cur.fetchone()[0]
    worker.commit()

    claimed = acked = bounced = retried = batches = empty_calls = 0
    while True:
        with worker.cursor() as cur:
            cur.execute("SELECT id, attempt, recipient FROM gatekeeper.claim(%s, %s, %s, %s)",
                        ("driver-app", BATCH, "5 minutes", [QUEUE]))
            rows = cur.fetchall()
        worker.commit()
        if rows:
            batches += 1
        claimed += len(rows)
        sent = ([], [])
        bounce = ([], [], [])
        busy = ([], [], [])
        for mail_id, attempt, rcpt in rows:
            if rcpt.startswith("bounce"):
                out = bounce
                out[2].append(BOUNCE.format(rcpt))
            elif rcpt.startswith("busy"):
                out = busy
                out[2].append(BUSY)
            else:
                out = sent
            out[0].append(mail_id)
            out[1].append(attempt)
        with worker.cursor() as cur:
            for arrays in (sent, bounce[:2], busy[:2]):
                if not arrays[0]:
                    empty_calls += 1
            cur.execute("SELECT gatekeeper.ack_batch(%s, %s)", sent)
            acked += cur.fetchone()[0]
            cur.execute("SELECT gatekeeper.nack_batch(%s, %s, %s, %s)", bounce + (True,))
            bounced += cur.fetchone()[0]
            cur.execute("SELECT gatekeeper.nack_batch(%s, %s, %s)", busy)
            retried += cur.fetchone()[0]
        worker.commit()
        # the last round claimed nothing, and reported that nothing
        if not rows:
            break
    say("sender", empty_ack=empty_ack, empty_nack=empty_nack,
        empty_nack_permanent=empty_nack_permanent, claimed=claimed, batches=batches,
        acked=acked, bounced=bounced, retried=retried, empty_calls=empty_calls)


def wait_notifies(conn, seconds):
    """The notifications that arrive on conn within seconds."""
    got = []
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return got
        if select.select([conn], [], [], left) == ([], [], []):
            return got
        conn.poll()
        while conn.notifies:
            n = conn.notifies.pop(0)
            got.append((n.channel, n.payload))


def step_listen(args, app, worker):
    """An external sender sleeps on LISTEN gatekeeper instead of polling:
    the application's transaction enqueues due mail into a notify queue
    (and into one without notify); nothing is heard before it commits,
    one notification naming the notify queue after; the sender wakes and
    claims that queue's mail."""
    with worker.cursor() as cur:
        cur.execute("LISTEN gatekeeper")
    worker.commit()
    with app.cursor() as cur:
        for i in range(3):
            cur.execute("SELECT gatekeeper.enqueue(%s, %s, %s, %s)",
                        ("wake%d@drivers.example" % i, "Your code", "1234", NOTIFY))
        cur.execute("SELECT gatekeeper.enqueue(%s, %s, %s, %s)",
                    ("quiet@drivers.example", "Hello", "Hello", QUIET))
        before = wait_notifies(worker, 0.5)
    app.commit()
    heard = wait_notifies(worker, 10)
    # a moment longer: a second notification for the same commit would show here
    heard += wait_notifies(worker, 0.5)
    with worker.cursor() as cur:
        queues = sorted(set(p for c, p in heard if c == "gatekeeper"))
        cur.execute("SELECT id, attempt FROM gatekeeper.claim(%s, %s, %s, %s)",
                    ("driver-app", BATCH, "5 minutes", queues))
        rows = cur.fetchall()
        cur.execute("SELECT gatekeeper.ack_batch(%s, %s)",
                    ([r[0] for r in rows], [r[1] for r in rows]))
        acked = cur.fetchone()[0]
        cur.execute("UNLISTEN gatekeeper")
        # when to look again for mail not yet due: the keyed mail of LATER
        cur.execute("SELECT extract(year FROM gatekeeper.next_due(%s))::int", ([LATER],))
        next_due_year = cur.fetchone()[0]
    worker.commit()
    say("listen", before_commit=len(before), notifications=len(heard),
        payloads=",".join(p for c, p in heard) or "-", claimed=len(rows), acked=acked,
        next_due_year=next_due_year)


def step_lookup(args, app, ids):
    """The application looks its mail up and cancels by its own key,
    without SELECT on gatekeeper.mail."""
    with app.cursor() as cur:
        cur.execute("SELECT state FROM gatekeeper.status(%s)", (ids["order-2"],))
        before = cur.fetchone()[0]
        cur.execute("SELECT gatekeeper.find(%s, %s)", (LATER, "order-2"))
        found = cur.fetchone()[0]
        cur.execute("SELECT gatekeeper.cancel(%s, %s)", (LATER, "order-2"))
        cancelled = cur.fetchone()[0]
        cur.execute("SELECT gatekeeper.cancel(%s, %s)", (LATER, "order-2"))
        again = cur.fetchone()[0]
        cur.execute("SELECT gatekeeper.cancel(%s, %s)", (LATER, "no-such-order"))
        unknown = cur.fetchone()[0]
        cur.execute("SELECT state FROM gatekeeper.status(%s)", (ids["order-2"],))
        after = cur.fetchone()[0]
        cur.execute("SELECT gatekeeper.cancel(%s)", (ids["order-3"],))
        by_id = cur.fetchone()[0]
        cur.execute("SELECT state, last_error FROM gatekeeper.history(%s)", (recipient(1000),))
        bounce_state, bounce_error = cur.fetchone()
        cur.execute("SELECT state FROM gatekeeper.history(%s, %s)", (recipient(1), "-infinity"))
        sent_state = cur.fetchone()[0]
        cur.execute("SELECT gatekeeper.find(%s, %s)", (LATER, "never-enqueued"))
        missing = cur.fetchone()[0]
    app.commit()
    say("lookup", before=before, found=(found == ids["order-2"]), cancelled=cancelled,
        cancelled_again=again, cancelled_unknown=unknown, after=after, cancelled_by_id=by_id,
        bounce=bounce_state, bounce_error_kept=(bounce_error == BOUNCE.format(recipient(1000))),
        sent=sent_state, find_missing=missing)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dbname", required=True)
    parser.add_argument("--enqueue-user", default="app_enqueue")
    parser.add_argument("--worker-user", default="app_worker")
    parser.add_argument("--mails", type=int, default=50000)
    args = parser.parse_args()

    app = connect(args, args.enqueue_user)
    worker = connect(args, args.worker_user)
    say("connected", psycopg2=psycopg2.__version__.split()[0], server=app.server_version)
    step_rollback(args, app)
    step_copy(args, app)
    ids = step_enqueue_keys(args, app)
    step_sender(args, worker)
    step_listen(args, app, worker)
    step_lookup(args, app, ids)
    app.close()
    worker.close()
    say("done", ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
