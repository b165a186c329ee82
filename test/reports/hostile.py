#!/usr/bin/python3
# Copyright: gatekeeper contributors
"""Write a corpus of hostile, malformed and truncated reports for
gatekeeper.ingest_report() (t/056_reports_hostile.pl feeds them in).

    hostile.py OUTDIR TOKEN RECIPIENT MESSAGE_ID

TOKEN, RECIPIENT and MESSAGE_ID are those of a mail gatekeeper sent: the
reports that carry them are ones the parser must not reach (nested past
its depth bound, cut off before the delivery status, or whose recipient
is another); the others name mail of other senders.  Every file is one
report, in octets: no NUL (a text value cannot hold one), anything else
goes.  Prints the number of files written.
"""

import base64
import os
import random
import sys

outdir, token, rcpt, msgid = sys.argv[1:5]
os.makedirs(outdir, exist_ok=True)
rnd = random.Random(27)
n = 0


def write(data):
    global n
    if isinstance(data, str):
        data = data.encode('latin-1', 'replace')
    data = data.replace(b'\0', b' ')
    n += 1
    with open(os.path.join(outdir, '%04d.eml' % n), 'wb') as f:
        f.write(data)


def dsn(boundary='BND', token_=None, rcpt_=None, msgid_=None, status='5.1.1',
        action='failed', envid=True, crlf=False):
    """A well-formed Postfix-style DSN."""
    t = token_ or ''.join(rnd.choice('abcdefghijklmnopqrstuvwxyz234567') for _ in range(29))
    r = rcpt_ or 'someone%d@elsewhere.example' % rnd.randrange(10**6)
    m = msgid_ or '<%d.%x@other-sender.example>' % (rnd.randrange(10**9), rnd.randrange(10**12))
    s = ('From: MAILER-DAEMON@mx.example\n'
         'To: bounces+%s@bounce.example\n'
         'Subject: Undelivered Mail Returned to Sender\n'
         'MIME-Version: 1.0\n'
         'Content-Type: multipart/report; report-type=delivery-status; boundary="%s"\n'
         '\n'
         '--%s\n'
         'Content-Type: text/plain\n'
         '\n'
         'I am sorry.\n'
         '--%s\n'
         'Content-Type: message/delivery-status\n'
         '\n'
         'Reporting-MTA: dns; mx.example\n'
         '%s'
         '\n'
         'Final-Recipient: rfc822; %s\n'
         'Action: %s\n'
         'Status: %s\n'
         'Diagnostic-Code: smtp; 550 %s no such user\n'
         '\n'
         '--%s\n'
         'Content-Type: text/rfc822-headers\n'
         '\n'
         'Message-ID: %s\n'
         'To: %s\n'
         '\n'
         '--%s--\n') % (t, boundary, boundary, boundary,
                        'Original-Envelope-Id: %s\n' % t if envid else '',
                        r, action, status, status, boundary, m, r, boundary)
    if crlf:
        s = s.replace('\n', '\r\n')
    return s


# 1. reports for other senders: well formed, naming mail gatekeeper never sent
for i in range(30):
    write(dsn(crlf=i % 2 == 0, action=['failed', 'delayed', 'delivered'][i % 3]))

# 2. the real mail's token and Message-ID, but another recipient (forged)
for i in range(10):
    write(dsn(token_=token, msgid_=msgid, rcpt_='victim%d@%s' % (i, rcpt.split('@')[-1])))

# 3. nested multiparts past the depth bound, the real mail at the bottom
for depth in (9, 10, 12, 16, 32, 64, 200, 1000, 2000, 5000):
    inner = dsn(boundary='B0', token_=token, rcpt_=rcpt, msgid_=msgid)
    body = inner.split('\n\n', 1)[1]
    ctype = 'multipart/report; report-type=delivery-status; boundary="B0"'
    for level in range(1, depth + 1):
        b = 'B%d' % level
        body = ('--%s\nContent-Type: %s\n\n%s\n--%s--\n' % (b, ctype, body, b))
        ctype = 'multipart/mixed; boundary="%s"' % b
    write('From: MAILER-DAEMON@mx.example\nMIME-Version: 1.0\nContent-Type: %s\n\n%s' % (ctype, body))

# 4. missing, empty, absurd boundaries
base = dsn()
write(base.replace('; boundary="BND"', ''))
write(base.replace('boundary="BND"', 'boundary=""'))
write(base.replace('boundary="BND"', 'boundary="NEVER-THERE"'))
write(base.replace('--BND--\n', ''))
write(base.replace('--BND', '--XYZ'))
write(base.replace('boundary="BND"', 'boundary="%s"' % ('x' * 100000)))
write(base.replace('BND', 'B' * 250))
write(base.replace('boundary="BND"', 'boundary="BND'))
write(base.replace('boundary="BND"', 'boundary=\\"BND\\"'))
write(base.replace('\n--BND', '\n--BND' * 2))

# 5. ten-megabyte lines: in a header, in a field, in the body, no line break at all
big = 10 * 1024 * 1024
write('X-Long: ' + 'a' * big + '\n' + base)
write(base.replace('Reporting-MTA: dns; mx.example', 'Reporting-MTA: dns; ' + 'm' * big))
write(base.replace('Diagnostic-Code: smtp; ', 'Diagnostic-Code: smtp; ' + 'd' * big))
write(base.replace('I am sorry.', 'z' * big))
write('y' * big)
write(base.replace('Final-Recipient: rfc822; ', 'Final-Recipient: rfc822; ' + 'r' * big))
write(base.replace('Content-Type: message/delivery-status\n', 'Content-Type: message/delivery-status\n' + ' ' * big + '\n'))
write(base.replace('Status: 5.1.1', 'Status: 5.' + '1' * big + '.1'))

# 6. truncated: a report of another sender cut at 100 points
base = dsn(crlf=True)
for cut in sorted(rnd.sample(range(1, len(base)), 100)):
    write(base[:cut])

# 7. wrong charsets and encodings
base = dsn()
write(base.replace('Content-Type: text/plain\n', 'Content-Type: text/plain; charset="utf-16"\n')
      .replace('I am sorry.', '\xff\xfeI\x01 \x01a\x01m'))
write(base.replace('I am sorry.', ''.join(chr(rnd.randrange(128, 256)) for _ in range(2000))))
write(base.replace('Final-Recipient: rfc822; ', 'Final-Recipient: rfc822; \xe9\xe8\xff'))
write(base.replace('Diagnostic-Code: smtp; ', 'Diagnostic-Code: smtp; \xc3\x28\xa0\xa1\xe2\x28\xa1'))
write(base.replace('Content-Type: message/delivery-status\n',
                   'Content-Type: message/delivery-status\nContent-Transfer-Encoding: base64\n'))
write(base.replace('Content-Type: message/delivery-status\n',
                   'Content-Type: message/delivery-status\nContent-Transfer-Encoding: quoted-printable\n')
      .replace('Action: failed', 'Action: fa=ZZiled=\n=\n=3'))
write(base.replace('Subject: Undelivered Mail Returned to Sender',
                   'Subject: =?utf-8?B?' + 'A' * 5000 + '?= =?iso-2022-jp?Q?=1B$B?='))
ds = ('Reporting-MTA: dns; mx.example\n\nFinal-Recipient: rfc822; x@other.example\n'
      'Action: failed\nStatus: 5.1.1\n')
write(base.split('--BND\nContent-Type: message/delivery-status')[0]
      + '--BND\nContent-Type: message/delivery-status\nContent-Transfer-Encoding: base64\n\n'
      + base64.b64encode((ds * 300000).encode()).decode() + '\n--BND--\n')
write(base.replace('Content-Type: message/delivery-status', 'Content-Type: message/delivery-status; charset=ebcdic-cp-us'))
write(base.replace('\n', '\r'))

# 8. structure gone wrong
write('')
write('\n\n\n')
write('Content-Type: multipart/report; boundary=x\n\n' + '--x\n' * 50000)
write('Content-Type: multipart/report; boundary=x\n\n'
      + ('--x\nContent-Type: message/delivery-status\n\n' + 'Final-Recipient: rfc822; a@b.example\nAction: failed\n\n' * 50) * 300)
write('Content-Type: multipart/report; boundary=x\n\n--x\nContent-Type: message/delivery-status\n\n'
      + ''.join('Final-Recipient: rfc822; r%d@other.example\nAction: failed\nStatus: 5.1.1\n\n' % i for i in range(20000)))
write(''.join('X-F%d: v\n' % i for i in range(200000)) + '\n' + dsn())
write('\n'.join(' continuation' for _ in range(100000)))
write(dsn().replace('Final-Recipient: rfc822; ', 'Final-Recipient: '))
write(dsn().replace('Status: 5.1.1', 'Status: 9.999999.1'))
write(dsn().replace('Action: failed', 'Action: ' + 'failed' * 10))
write(dsn(msgid_='<%s.1@x.example>' % ('9' * 40)))
write(dsn(msgid_='<-1.1@x.example>', envid=False))
write(dsn(msgid_='<0.0@x.example>', envid=False))
write(dsn(msgid_='<' + msgid[1:].replace('.', '', 1), envid=False, rcpt_=rcpt))
write(dsn(token_=token.upper()[:-1] + ('B' if token[-1] == 'a' else 'A'), rcpt_=rcpt, msgid_='<1.1@x.example>'))
write(dsn(token_=token[:28], rcpt_=rcpt, msgid_='<1.1@x.example>'))
write(dsn(token_=token + 'a', rcpt_=rcpt, msgid_='<1.1@x.example>'))
write(dsn().replace('multipart/report', 'multipart/' + 'r' * 10000))
write(dsn().replace('Content-Type: message/delivery-status', 'Content-Type: ' + ';' * 10000))
write(dsn().replace('Content-Type: message/delivery-status', 'Content-Type: message/delivery-status; ' + 'a=b; ' * 20000))
write('Content-Type: multipart/report; boundary=x\n\n--x\nContent-Type: message/feedback-report\n\n'
      'Feedback-Type: abuse\nOriginal-Rcpt-To: ' + rcpt + '\n\n--x\nContent-Type: message/rfc822\n\n'
      'Message-ID: <424242.ffff@shop.example>\n\n--x--\n')
# (a not-spam report naming the real mail is no hostile report since issue
# 49: it is kept as a 'feedback' event, suppressing no one; see
# sql/46_reports_corpus.sql)
write('Content-Type: multipart/report; boundary=x\n\n--x\nContent-Type: message/feedback-report\n\n'
      'Feedback-Type: abuse\nOriginal-Rcpt-To: someone@else.example\nOriginal-Mail-From: bounces+'
      + token + '@b.example\n\n--x--\n')
for i in range(30):
    # random octets shaped like headers and parts
    parts = []
    for _ in range(rnd.randrange(1, 40)):
        parts.append(rnd.choice(['--BND\n', '--BND--\n', 'Content-Type: message/delivery-status\n',
                                 'Content-Type: multipart/report; boundary=BND\n', '\n', 'Action: failed\n',
                                 'Final-Recipient: rfc822; %s\n' % rcpt, 'Status: 5.1.1\n',
                                 ''.join(chr(rnd.randrange(1, 256)) for _ in range(rnd.randrange(1, 300)))]))
    write('Content-Type: multipart/report; boundary=BND\n\n' + ''.join(parts))

print(n)
