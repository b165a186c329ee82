#!/usr/bin/python3
# Copyright: gatekeeper contributors
"""A relay that ends sessions or floods replies, for gatekeeper's TAP tests.

Listens on 127.0.0.1:PORT and speaks just enough ESMTP (EHLO, HELO, MAIL,
RCPT, DATA, BDAT, RSET, NOOP, QUIT) to take mail, one thread per
connection, replies written as each command is read (a client that
pipelines finds its later commands unread when the relay ends a session).
Offers PIPELINING and CHUNKING (--extensions chunking, the default),
PIPELINING alone (--extensions pipelining: DATA, and a client may write
its next transaction behind a message's final "."), or neither
(--extensions none, or --no-pipelining), plus SIZE, 8BITMIME and
ENHANCEDSTATUSCODES.  Writes one JSON object a line to --log, each with
its time ("t", seconds):

  {"event": "connect", "conn": N}
  {"event": "mail", "conn": N}       (a MAIL FROM arrived)
  {"event": "message", "conn": N, "message_id": "<...>", "size": N}
  {"event": "refused", "conn": N, "message_id": "<...>"}
  {"event": "dot", "conn": N, "ahead": BYTES}
      (with --dot-delay: octets of the client's next commands that had
      arrived when the "." was answered)
  {"event": "end", "conn": N, "how": "close" | "421" | "reset"}
  {"event": "flood", "conn": N, "sent": BYTES}
  {"event": "disconnect", "conn": N}

--session-limit N ends every session right after the Nth message it
accepted (its 250 written first), the way a relay with a per-connection
limit does, by --end:
  close   close(2) at once (with the client's pipelined commands unread,
          the kernel sends a reset)
  421     "421 4.7.0 too many messages in this session", then close
  reset   SO_LINGER 0 and close: a reset, whatever is unread

--end-at-mail ends every session (the same ways) when the first MAIL FROM
arrives, before any transaction is answered: a relay that takes nothing.

--dot-delay SECONDS answers each final "." that late, in order.
--dot-status X.Y.Z is the enhanced status code of a message's 250
(2.0.0; 2.1.5 is odd, an address status, but not out of order).
--refuse-prefix P answers the "." of a message to a recipient whose
address begins with P "554 5.6.0 message refused".
--reorder answers out of order, as RFC 2920 forbids (and smtp-sink -W
does): when the client wrote commands behind a ".", their replies go
first, and the "."'s after the 354 to the DATA among them.
--hold-data-behind never answers a DATA the client wrote behind a ".".
--defer TEXT answers every MAIL FROM with TEXT (a 4xx reply: "451 4.3.0
out of disk", "454 4.7.0 Throttling failure"), logging
  {"event": "deferred", "conn": N}
and the transaction's RCPT, DATA and BDAT with "503 5.5.1 MAIL first";
with --defer-file PATH only while PATH exists (the relay recovers when
the test removes it).

--flood makes the relay hostile, up to --flood-bytes octets:
  greeting       "220 " and then octets without a line end
  ehlo           the reply to EHLO continues ("250-...") without end
  mail-line      MAIL FROM is answered "250 " + --flood-bytes octets + CRLF

Bounded: exits after --lifetime seconds or when its parent goes away.
"""

import argparse
import json
import os
import select
import socket
import struct
import sys
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument('--port', type=int, required=True)
ap.add_argument('--log', required=True)
ap.add_argument('--session-limit', type=int, default=0)
ap.add_argument('--end', default='close', choices=['close', '421', 'reset'])
ap.add_argument('--end-at-mail', action='store_true')
ap.add_argument('--no-pipelining', action='store_true')
ap.add_argument('--extensions', default='chunking',
                choices=['chunking', 'pipelining', 'none'])
ap.add_argument('--dot-delay', type=float, default=0)
ap.add_argument('--refuse-prefix')
ap.add_argument('--dot-status', default='2.0.0')
ap.add_argument('--reorder', action='store_true')
ap.add_argument('--hold-data-behind', action='store_true')
ap.add_argument('--defer')
ap.add_argument('--defer-file')
ap.add_argument('--flood', choices=['greeting', 'ehlo', 'mail-line'])
ap.add_argument('--flood-bytes', type=int, default=200 * 1024 * 1024)
ap.add_argument('--lifetime', type=int, default=600)
args = ap.parse_args()

lock = threading.Lock()
logf = open(args.log, 'a', buffering=1)
state = {'conns': 0}


def log(**kw):
    kw['t'] = round(time.time(), 3)
    with lock:
        logf.write(json.dumps(kw, sort_keys=True) + '\n')


def message_id(data):
    head = data.split(b'\r\n\r\n', 1)[0]
    for line in head.split(b'\r\n'):
        if line[:11].lower() == b'message-id:':
            return line[11:].strip().decode('ascii', 'replace')
    return None


def flood(sock, conn, prefix, piece, suffix=b''):
    """Write prefix, then piece repeated up to --flood-bytes, then suffix."""
    sent = 0
    try:
        sock.sendall(prefix)
        while sent < args.flood_bytes:
            sock.sendall(piece)
            sent += len(piece)
        sock.sendall(suffix)
    except OSError:
        pass
    log(event='flood', conn=conn, sent=sent)


class Reader:
    """Lines and octets from a socket, with what has arrived unread in
    sight (a buffered file object hides it)."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b''
        self.eof = False

    def fill(self, wait):
        """Read what has arrived, waiting up to wait seconds for it; a
        minute without a byte is the end."""
        if self.eof:
            return
        if not select.select([self.sock], [], [], wait)[0]:
            self.eof = wait >= 60
            return
        data = self.sock.recv(8192)
        if not data:
            self.eof = True
        self.buf += data

    def readline(self, limit):
        while b'\n' not in self.buf[:limit] and len(self.buf) < limit and not self.eof:
            self.fill(60)
        n = self.buf.find(b'\n', 0, limit)
        n = len(self.buf[:limit]) if n < 0 else n + 1
        line, self.buf = self.buf[:n], self.buf[n:]
        return line

    def read(self, n):
        while len(self.buf) < n and not self.eof:
            self.fill(60)
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def close(self):
        pass


class Session:
    def __init__(self, sock, conn):
        self.sock = sock
        self.conn = conn
        self.rfile = Reader(sock)
        self.messages = 0
        self.mail_from = None
        self.rcpts = 0
        self.rcpt = ''
        self.deferred = None    # --reorder: the reply to a "." held back
        self.behind = False     # commands were written behind the last "."

    def reply(self, text):
        self.sock.sendall(text.encode() + b'\r\n')

    def end(self):
        log(event='end', conn=self.conn, how=args.end)
        if args.end == '421':
            self.reply('421 4.7.0 too many messages in this session')
        elif args.end == 'reset':
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                 struct.pack('ii', 1, 0))
        # the client's pipelined commands stay unread
        self.rfile.close()
        self.sock.close()

    def accepted(self, data):
        self.mail_from = None
        self.rcpts = 0
        if args.reorder or args.hold_data_behind:
            # what the client wrote behind the "." (a moment for it to arrive)
            self.rfile.fill(0.05)
            self.behind = len(self.rfile.buf) > 0
        if args.dot_delay:
            time.sleep(args.dot_delay)
            self.rfile.fill(0)
            log(event='dot', conn=self.conn, ahead=len(self.rfile.buf))
        if args.refuse_prefix and self.rcpt.startswith(args.refuse_prefix):
            log(event='refused', conn=self.conn, message_id=message_id(data))
            text = '554 5.6.0 message refused'
        else:
            self.messages += 1
            log(event='message', conn=self.conn, message_id=message_id(data),
                size=len(data))
            text = '250 %s OK queued as %d.%d' % (args.dot_status, self.conn, self.messages)
        if args.reorder and self.behind:
            self.deferred = text
            return True
        self.reply(text)
        if args.session_limit and self.messages >= args.session_limit:
            self.end()
            return False
        return True

    def run(self):
        if args.flood == 'greeting':
            flood(self.sock, self.conn, b'220 ', b'x' * 65536)
            return
        self.reply('220 hostile.test.example ESMTP')
        while True:
            line = self.rfile.readline(4096)
            if not line:
                return
            cmd = line.rstrip(b'\r\n').decode('utf-8', 'replace')
            verb = cmd[:4].upper()
            if verb == 'EHLO':
                if args.flood == 'ehlo':
                    flood(self.sock, self.conn, b'250-hostile.test.example\r\n',
                          b'250-' + b'X' * 60 + b'\r\n')
                    return
                ext = ['SIZE 10240000', '8BITMIME', 'ENHANCEDSTATUSCODES']
                if args.no_pipelining or args.extensions == 'none':
                    pass
                elif args.extensions == 'pipelining':
                    ext = ['PIPELINING'] + ext
                else:
                    ext = ['PIPELINING', 'CHUNKING'] + ext
                lines = ['hostile.test.example'] + ext
                for i, text in enumerate(lines):
                    sep = ' ' if i == len(lines) - 1 else '-'
                    self.reply('250' + sep + text)
            elif verb == 'HELO':
                self.reply('250 hostile.test.example')
            elif verb == 'MAIL':
                if args.end_at_mail:
                    self.end()
                    return
                if args.flood == 'mail-line':
                    flood(self.sock, self.conn, b'250 ', b'y' * 65536, b'\r\n')
                    continue
                log(event='mail', conn=self.conn)
                if args.defer and (not args.defer_file or os.path.exists(args.defer_file)):
                    log(event='deferred', conn=self.conn)
                    self.mail_from = None
                    self.reply(args.defer)
                    continue
                self.mail_from = cmd
                self.reply('250 2.1.0 OK')
            elif verb == 'RCPT':
                if args.defer and self.mail_from is None:
                    self.reply('503 5.5.1 MAIL first')
                    continue
                self.rcpts += 1
                self.rcpt = cmd[8:].strip().lstrip('<')
                self.reply('250 2.1.5 OK')
            elif verb == 'DATA' and args.defer and self.mail_from is None:
                self.reply('503 5.5.1 MAIL first')
            elif verb == 'DATA':
                if args.hold_data_behind and self.behind:
                    log(event='held', conn=self.conn)
                    continue
                self.reply('354 end with .')
                if self.deferred is not None:
                    self.reply(self.deferred)
                    self.deferred = None
                data = []
                while True:
                    l = self.rfile.readline(65536)
                    if not l:
                        return
                    if l == b'.\r\n':
                        break
                    if l.startswith(b'.'):
                        l = l[1:]
                    data.append(l)
                if not self.accepted(b''.join(data)):
                    return
            elif verb == 'BDAT':
                parts = cmd.split()
                n = int(parts[1])
                data = self.rfile.read(n)
                if len(data) < n:
                    return
                if args.defer and self.mail_from is None:
                    self.reply('503 5.5.1 MAIL first')
                elif len(parts) > 2 and parts[2].upper() == 'LAST':
                    if not self.accepted(data):
                        return
                else:
                    self.reply('250 2.0.0 %d octets' % n)
            elif verb == 'RSET':
                self.mail_from = None
                self.rcpts = 0
                self.reply('250 2.0.0 OK')
            elif verb == 'NOOP':
                self.reply('250 2.0.0 OK')
            elif verb == 'QUIT':
                if self.deferred is not None:
                    self.reply(self.deferred)
                    self.deferred = None
                self.reply('221 2.0.0 bye')
                return
            else:
                self.reply('502 5.5.2 command not recognized')


def serve(sock, conn):
    log(event='connect', conn=conn)
    session = Session(sock, conn)
    try:
        session.run()
    except OSError:
        pass
    finally:
        try:
            session.rfile.close()
            sock.close()
        except OSError:
            pass
        log(event='disconnect', conn=conn)


def main():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(('127.0.0.1', args.port))
    srv.listen(128)
    srv.settimeout(0.2)
    log(event='listening', port=args.port)
    parent = os.getppid()
    deadline = time.time() + args.lifetime
    while time.time() < deadline and os.getppid() == parent:
        try:
            sock, _ = srv.accept()
        except socket.timeout:
            continue
        sock.settimeout(60)
        # every reply on the wire when written: a reply still held back by
        # Nagle's algorithm would be thrown away by the reset that closing
        # with unread input sends, and no client could read it
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state['conns'] += 1
        threading.Thread(target=serve, args=(sock, state['conns']),
                         daemon=True).start()
    srv.close()


try:
    main()
except KeyboardInterrupt:
    pass
sys.exit(0)
