# Copyright: gatekeeper contributors
#
# An SMTP relay on loopback that refuses some recipients as unknown
# (aiosmtpd, Debian's python3-aiosmtpd), for the TAP tests.
#
#   python3 bounce_relay.py PORT DIR UNKNOWN[,UNKNOWN...]
#
# Answers RCPT TO for each UNKNOWN address with
# "550 5.1.1 <address>: Recipient address rejected: User unknown" and
# accepts every other recipient.  Appends to DIR/log one line per RCPT TO
# ("rcpt refused ADDRESS" or "rcpt ok ADDRESS") and per message
# ("message FROM TO OCTETS"), and writes each message's bytes to
# DIR/msg-N.eml.  Prints "ready" on stdout once it listens.

import os
import sys
import time

from aiosmtpd.controller import Controller

port, directory = int(sys.argv[1]), sys.argv[2]
unknown = {a.lower() for a in sys.argv[3].split(",") if a}
count = 0


def log(line):
    with open(os.path.join(directory, "log"), "a") as f:
        f.write(line + "\n")


class Handler:
    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.lower() in unknown:
            log("rcpt refused %s" % address)
            return "550 5.1.1 <%s>: Recipient address rejected: User unknown" % address
        log("rcpt ok %s" % address)
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        global count
        count += 1
        with open(os.path.join(directory, "msg-%d.eml" % count), "wb") as f:
            f.write(envelope.original_content or envelope.content)
        log("message %s %s %d" % (envelope.mail_from, ",".join(envelope.rcpt_tos),
                                  len(envelope.content)))
        return "250 OK"


controller = Controller(Handler(), hostname="127.0.0.1", port=port)
controller.start()
print("ready", flush=True)
try:
    while True:
        time.sleep(3600)
except KeyboardInterrupt:
    pass
finally:
    controller.stop()
