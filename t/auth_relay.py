# Copyright: gatekeeper contributors
#
# An SMTP relay on loopback that requires AUTH (aiosmtpd, Debian's
# python3-aiosmtpd), for the TAP tests.
#
#   python3 auth_relay.py PORT USER PASSWORD LOG
#
# Offers AUTH PLAIN and LOGIN without TLS (loopback only), accepts only
# USER with PASSWORD, and refuses mail from a session that did not log in.
# Appends one line to LOG per login attempt ("auth ok USER" or "auth
# refused USER") and per message ("message FROM TO OCTETS").  Prints
# "ready" on stdout once it listens.

import sys
import time

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

port, user, password, log_path = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]


def log(line):
    with open(log_path, "a") as f:
        f.write(line + "\n")


def authenticator(server, session, envelope, mechanism, auth_data):
    login = auth_data.login.decode("utf-8", "replace")
    ok = login == user and auth_data.password.decode("utf-8", "replace") == password
    log("auth %s %s %s" % ("ok" if ok else "refused", mechanism, login))
    return AuthResult(success=ok)


class Handler:
    async def handle_DATA(self, server, session, envelope):
        log("message %s %s %d" % (envelope.mail_from, ",".join(envelope.rcpt_tos),
                                  len(envelope.content)))
        return "250 OK"


controller = Controller(Handler(), hostname="127.0.0.1", port=port,
                        authenticator=authenticator, auth_required=True,
                        auth_require_tls=False)
controller.start()
print("ready", flush=True)
try:
    while True:
        time.sleep(3600)
except KeyboardInterrupt:
    pass
finally:
    controller.stop()
