#!/usr/bin/python3
# Copyright: gatekeeper contributors
"""Verify the DKIM signatures of messages with dkimpy (Debian's python3-dkim).

Usage: dkim_verify.py KEYS.json MESSAGE...

KEYS.json maps DNS names ("<selector>._domainkey.<domain>") to their TXT
records ("v=DKIM1; k=rsa; p=..."); dkimpy is given them through its DNS
hook, so nothing is looked up.  Each MESSAGE is a file of the message's
octets (CRLF line ends).  For every signature of every message one line
is printed:

  <file> <index> <d=> <a=> pass|fail
  <file> - none          (the message has no DKIM-Signature)

Exits 0 whatever the verdicts; 2 on a usage error.
"""

import json
import re
import sys

import dkim

if len(sys.argv) < 2:
    sys.stderr.write(__doc__)
    sys.exit(2)

with open(sys.argv[1]) as f:
    records = json.load(f)


def dnsfunc(name, timeout=5):
    """dkimpy's DNS hook: the TXT record of name, from KEYS.json."""
    if isinstance(name, bytes):
        name = name.decode('ascii')
    record = records.get(name.rstrip('.').lower())
    return record.encode('ascii') if record is not None else None


for path in sys.argv[2:]:
    with open(path, 'rb') as f:
        message = f.read()
    d = dkim.DKIM(message)
    head = message.split(b'\r\n\r\n', 1)[0]
    sigs = re.findall(rb'^dkim-signature:((?:.*\r\n(?:[ \t].*\r\n)*))', head + b'\r\n',
                      re.IGNORECASE | re.MULTILINE)
    if not sigs:
        print(f'{path} - none')
        continue
    for i, sig in enumerate(sigs):
        tags = dict(re.findall(rb'\s*([a-z]+)\s*=\s*([^;]*)', re.sub(rb'\s+', b'', sig)))
        try:
            ok = d.verify(idx=i, dnsfunc=dnsfunc)
        except Exception as e:  # a verifier's error is a failure
            sys.stderr.write(f'{path} {i}: {e}\n')
            ok = False
        print(f"{path} {i} {tags.get(b'd', b'?').decode()} {tags.get(b'a', b'?').decode()} "
              f"{'pass' if ok else 'fail'}")
