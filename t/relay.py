#!/usr/bin/python3
# Copyright: gatekeeper contributors
"""A scriptable SMTP relay for gatekeeper's TAP tests, on aiosmtpd.

Listens on 127.0.0.1:PORT.  Offers STARTTLS when --cert/--key are given
(--require-tls: no MAIL before it), AUTH PLAIN and LOGIN when --auth
USER:PASSWORD_FILE is given (only over TLS when TLS is offered), and
writes one JSON object a line to --log for everything it sees:

  {"event": "connect", "conn": N}
  {"event": "command", "conn": N, "line": "EHLO mta.example.com",
   "ahead": BYTES}
      (AUTH arguments are never logged: "AUTH PLAIN [redacted]"; ahead:
      octets the client had already sent past this command when it was
      read: aiosmtpd offers no PIPELINING, so ahead > 0 means the client
      pipelined without being offered it)
  {"event": "tls", "conn": N}                 STARTTLS completed
  {"event": "auth", "conn": N, "user": "...", "ok": true}
  {"event": "mail", "conn": N, "from": "...", "tls": bool, "user": ...}
  {"event": "message", "conn": N, "from": "...", "rcpt": [...],
   "data_file": "...", "size": N, "tls": bool, "user": ...}
  {"event": "hang", "conn": N}
  {"event": "disconnect", "conn": N}

Each message's octets (as received, CRLF line ends, dot-stuffing undone)
go to a file of their own under --dir.

Modes (--mode):
  accept        accept everything (the default)
  reject-mail   answer every MAIL FROM with 550 5.7.1 Client host rejected
  hang-first    the first connection gets the greeting and then nothing,
                ever; the others are served normally

--rcpt-replies answers RCPT TO by the recipient's local part: one that
begins with "hard" gets 550 5.1.1 (no such mailbox), "soft" 451 4.3.0;
the others 250; "multi" gets a reply of two lines whose first says 550
5.1.1 (the mailbox does not exist) and whose last carries another code,
5.7.1, with no words of its own (RFC 2034: the first line's code is the
reply's); "mislead" one line 550 5.2.2 (mailbox full) whose text quotes
another code, 5.1.1.  --data-delay SECONDS waits that long before answering
the end of each message's data (a slow relay, for leases to run low).

Bounded: exits after --lifetime seconds or when its parent goes away, and
refuses connections beyond --max-connections at once.  The password is
read from a file and never written anywhere.
"""

import argparse
import asyncio
import json
import os
import ssl
import sys
import time

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword

ap = argparse.ArgumentParser()
ap.add_argument('--port', type=int, required=True)
ap.add_argument('--log', required=True)
ap.add_argument('--dir', required=True)
ap.add_argument('--mode', default='accept',
                choices=['accept', 'reject-mail', 'hang-first'])
ap.add_argument('--cert')
ap.add_argument('--key')
ap.add_argument('--require-tls', action='store_true')
ap.add_argument('--auth', help='USER:FILE holding the password')
ap.add_argument('--hostname', default='relay.test.example')
ap.add_argument('--max-connections', type=int, default=64)
ap.add_argument('--rcpt-replies', action='store_true')
ap.add_argument('--data-delay', type=float, default=0)
ap.add_argument('--lifetime', type=int, default=600)
args = ap.parse_args()

os.makedirs(args.dir, exist_ok=True)
logf = open(args.log, 'a', buffering=1)


def log(**kw):
    kw['t'] = round(time.time(), 3)
    logf.write(json.dumps(kw, sort_keys=True) + '\n')


auth_user = auth_password = None
if args.auth:
    auth_user, pwfile = args.auth.split(':', 1)
    with open(pwfile, 'rb') as f:
        auth_password = f.read().rstrip(b'\r\n')

tls_context = None
if args.cert:
    tls_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls_context.load_cert_chain(args.cert, args.key)

state = {'conns': 0, 'open': 0, 'messages': 0}


def authenticator(server, session, envelope, mechanism, auth_data):
    ok = (isinstance(auth_data, LoginPassword)
          and auth_data.login == auth_user.encode()
          and auth_data.password == auth_password)
    if ok:
        session.gk_user = auth_user
    log(event='auth', conn=getattr(session, 'gk_conn', None),
        mechanism=mechanism,
        user=auth_data.login.decode('utf-8', 'replace')
        if isinstance(auth_data, LoginPassword) else None,
        ok=ok)
    return AuthResult(success=ok)


class Handler:
    async def handle_MAIL(self, server, session, envelope, address, mail_options):
        log(event='mail', conn=session.gk_conn, **{'from': address},
            options=mail_options, tls=session.ssl is not None,
            user=getattr(session, 'gk_user', None))
        if args.mode == 'reject-mail':
            return '550 5.7.1 <%s>: Client host rejected: Access denied' % session.peer[0]
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return '250 2.1.0 OK'

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        local = address.split('@', 1)[0].lower()
        if args.rcpt_replies and local.startswith('hard'):
            return '550 5.1.1 <%s>: Recipient address rejected: User unknown' % address
        if args.rcpt_replies and local.startswith('multi'):
            return ('550-5.1.1 <%s>: the email account that you tried to reach is gone\r\n'
                    '550 5.7.1 see https://support.relay.example/bounce' % address)
        if args.rcpt_replies and local.startswith('mislead'):
            return ('550 5.2.2 <%s>: quota reached (not 5.1.1, the account is there)'
                    % address)
        if args.rcpt_replies and local.startswith('soft'):
            return '451 4.3.0 <%s>: Temporary failure, try again later' % address
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return '250 2.1.5 OK'

    async def handle_DATA(self, server, session, envelope):
        if args.data_delay > 0:
            await asyncio.sleep(args.data_delay)
        state['messages'] += 1
        path = os.path.join(args.dir, 'msg-%06d.eml' % state['messages'])
        data = envelope.original_content or envelope.content
        if isinstance(data, str):
            data = data.encode('utf-8', 'surrogateescape')
        with open(path + '.tmp', 'wb') as f:
            f.write(data)
        os.rename(path + '.tmp', path)
        log(event='message', conn=session.gk_conn,
            **{'from': envelope.mail_from}, rcpt=list(envelope.rcpt_tos),
            data_file=path, size=len(data), tls=session.ssl is not None,
            user=getattr(session, 'gk_user', None))
        return '250 2.0.0 OK queued as %06d' % state['messages']


class LoggingSMTP(SMTP):
    def connection_made(self, transport):
        first = self.transport is None
        super().connection_made(transport)
        if first:
            state['conns'] += 1
            state['open'] += 1
            self.gk_conn = state['conns']
            self.session.gk_conn = self.gk_conn
            log(event='connect', conn=self.gk_conn)
        else:
            # STARTTLS: aiosmtpd makes a new session
            self.session.gk_conn = self.gk_conn
            log(event='tls', conn=self.gk_conn)

    def connection_lost(self, exc):
        if getattr(self, 'gk_conn', None) is not None and not getattr(self, 'gk_lost', False):
            self.gk_lost = True
            state['open'] -= 1
            log(event='disconnect', conn=self.gk_conn)
        super().connection_lost(exc)

    def _log_command(self, line):
        text = line.decode('utf-8', 'replace').rstrip('\r\n')
        if text[:4].upper() == 'AUTH':
            text = ' '.join(text.split()[:2]) + ' [redacted]'
        # bytes the client sent past this command before seeing its
        # reply: this relay offers no PIPELINING, so any is a violation
        ahead = len(getattr(self._reader, '_buffer', b''))
        log(event='command', conn=self.gk_conn, line=text, ahead=ahead)

    async def smtp_EHLO(self, hostname):
        self._log_command(b'EHLO ' + hostname.encode())
        return await super().smtp_EHLO(hostname)

    async def smtp_HELO(self, hostname):
        self._log_command(b'HELO ' + hostname.encode())
        return await super().smtp_HELO(hostname)

    async def smtp_MAIL(self, arg):
        self._log_command(b'MAIL ' + (arg or '').encode())
        return await super().smtp_MAIL(arg)

    async def smtp_RCPT(self, arg):
        self._log_command(b'RCPT ' + (arg or '').encode())
        return await super().smtp_RCPT(arg)

    async def smtp_DATA(self, arg):
        self._log_command(b'DATA')
        return await super().smtp_DATA(arg)

    async def smtp_RSET(self, arg):
        self._log_command(b'RSET')
        return await super().smtp_RSET(arg)

    async def smtp_QUIT(self, arg):
        self._log_command(b'QUIT')
        return await super().smtp_QUIT(arg)

    async def smtp_STARTTLS(self, arg):
        self._log_command(b'STARTTLS')
        return await super().smtp_STARTTLS(arg)

    async def smtp_AUTH(self, arg):
        self._log_command(b'AUTH ' + (arg or '').encode())
        return await super().smtp_AUTH(arg)


class Hang(asyncio.Protocol):
    """A connection that greets and then never answers."""

    def connection_made(self, transport):
        state['conns'] += 1
        self.conn = state['conns']
        self.transport = transport
        log(event='connect', conn=self.conn)
        transport.write(('220 %s ESMTP\r\n' % args.hostname).encode())
        log(event='hang', conn=self.conn)

    def data_received(self, data):
        pass

    def connection_lost(self, exc):
        log(event='disconnect', conn=self.conn)


class Refuse(asyncio.Protocol):
    def connection_made(self, transport):
        transport.write(b'421 4.3.2 too many connections\r\n')
        transport.close()


def factory():
    # decided here, not in connection_made: connections accepted together
    # get their protocols before any of them is told it is connected
    if args.mode == 'hang-first' and not state.get('hung'):
        state['hung'] = True
        return Hang()
    if state['open'] >= args.max_connections:
        return Refuse()
    kw = dict(hostname=args.hostname, ident='gatekeeper test relay',
              enable_SMTPUTF8=True, decode_data=False)
    if tls_context is not None:
        kw.update(tls_context=tls_context, require_starttls=args.require_tls)
    if auth_user is not None:
        kw.update(authenticator=authenticator, auth_required=True,
                  auth_require_tls=tls_context is not None)
    return LoggingSMTP(Handler(), **kw)


async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(factory, host='127.0.0.1', port=args.port,
                                      reuse_address=True)
    log(event='listening', port=args.port, mode=args.mode)
    parent = os.getppid()
    deadline = time.time() + args.lifetime
    while time.time() < deadline and os.getppid() == parent:
        await asyncio.sleep(0.2)
    server.close()


try:
    asyncio.run(main())
except KeyboardInterrupt:
    pass
sys.exit(0)
