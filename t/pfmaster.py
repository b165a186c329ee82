#!/usr/bin/python3
# Copyright: gatekeeper contributors
"""Run a private Postfix smtpd on loopback, without Postfix's master(8).

  pfmaster.py --config DIR --queue DIR --port PORT --log FILE

Postfix's master(8) must be started by root ("the master command is
reserved for the superuser"), and TAP tests run as the postgres user.
Postfix's daemons themselves run unprivileged when mail_owner is the
user running them, so this stands in for master, for the two services a
smtpd with `smtpd_proxy_filter` needs:

 - smtp: 127.0.0.1:PORT; each connection gets its own `smtpd -S`
   (stand-alone mode: the client is stdin/stdout), as inetd would.
   With smtpd_proxy_filter pointing at an smtp-sink, smtpd needs no
   cleanup(8) or queue: it checks everything (HELO, SIZE, recipients,
   CHUNKING, PIPELINING) and hands each accepted message to the sink.
 - private/rewrite: trivial-rewrite(8), which smtpd asks to resolve
   addresses.  It runs as master would run it (its listening socket on
   fd 6, a status pipe on fd 5, see master_proto.h) because in -S mode
   it cannot write its replies (its stdin stream is read-only).

Postfix logs to the postlog(1) socket public/postlog when maillog_file
is set; this reads that socket and appends each record to --log (with
its own lines, "pfmaster[pid]: ...").  Nothing logs to syslog.

Bounded: at most --max-children smtpd processes at once, exits (killing
its children) after --lifetime seconds, on SIGTERM, or when its parent
goes away.
"""
import argparse, ctypes, os, signal, socket, select, sys, time

ap = argparse.ArgumentParser()
ap.add_argument('--config', required=True)
ap.add_argument('--queue', required=True)
ap.add_argument('--port', type=int, required=True)
ap.add_argument('--log', required=True)
ap.add_argument('--daemon-dir', default='/usr/lib/postfix/sbin')
ap.add_argument('--max-children', type=int, default=64)
ap.add_argument('--lifetime', type=int, default=600)
args = ap.parse_args()

log = open(args.log, 'ab', buffering=0)
def note(msg):
    log.write(('pfmaster[%d]: %s\n' % (os.getpid(), msg)).encode())

env = dict(os.environ, MAIL_CONFIG=args.config)
for d in ('private', 'public'):
    os.makedirs(os.path.join(args.queue, d), exist_ok=True)

def unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

smtp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
smtp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
smtp.bind(('127.0.0.1', args.port))
smtp.listen(128)

rewrite_path = os.path.join(args.queue, 'private', 'rewrite')
unlink(rewrite_path)
rewrite = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
rewrite.bind(rewrite_path)
rewrite.listen(64)

postlog_path = os.path.join(args.queue, 'public', 'postlog')
unlink(postlog_path)
postlog = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
postlog.bind(postlog_path)

status_r, status_w = os.pipe()
children = set()
rewrite_pid = None

def spawn(cmd, fds):
    pid = os.fork()
    if pid == 0:
        try:
            # die with this process, however it ends
            try:
                ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            except Exception:
                pass
            # first out of the way, then into place: a source may be
            # another's target
            fds.setdefault(0, os.open('/dev/null', os.O_RDWR))
            fds.setdefault(1, fds[0] if fds[0] != 0 else os.open('/dev/null', os.O_RDWR))
            fds[2] = log.fileno()
            high = {t: os.dup2(fd, 200 + t) for t, fd in fds.items()}
            for t, fd in high.items():
                os.dup2(fd, t, inheritable=True)
            os.closerange(max(fds) + 1, 1024)
            os.execve(os.path.join(args.daemon_dir, cmd[0]), cmd, env)
        finally:
            os._exit(127)
    children.add(pid)
    return pid

def spawn_rewrite():
    return spawn(['trivial-rewrite', '-n', 'rewrite', '-t', 'unix', '-s', '1',
                  '-o', 'max_idle=3600', '-o', 'max_use=1000000'],
                 {5: status_w, 6: rewrite.fileno()})

def reap():
    global rewrite_pid
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        if pid == rewrite_pid:
            note('trivial-rewrite exited (status %d), restarting' % st)
            rewrite_pid = spawn_rewrite()

def stop(*_):
    for pid in list(children):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # reap them: nobody else would (PID 1 in a container may not)
    for pid in list(children):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    os._exit(0)

signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
rewrite_pid = spawn_rewrite()
deadline = time.time() + args.lifetime
parent = os.getppid()
note('listening on 127.0.0.1:%d' % args.port)
while time.time() < deadline and os.getppid() == parent:
    reap()
    r, _, _ = select.select([postlog, smtp, status_r], [], [], 0.5)
    if status_r in r:
        os.read(status_r, 4096)
    if postlog in r:
        log.write(postlog.recv(65536).rstrip(b'\0\n') + b'\n')
    if smtp in r:
        conn, _ = smtp.accept()
        if len(children) >= args.max_children:
            conn.close()
            continue
        spawn(['smtpd', '-n', 'smtp', '-t', 'inet', '-S'], {0: conn.fileno(), 1: conn.fileno()})
        conn.close()
stop()
