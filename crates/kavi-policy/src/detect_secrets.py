"""Runs detect-secrets over the files named on the command line; prints its findings as JSON.

kavi runs this with the interpreter of a `secret_scan` gate's toolchain, confined as every gate
process is: without the network, where opening an IP socket is fatal. urllib3, which
detect-secrets imports, probes for IPv6 by opening one as it is imported; verifying a secret
with its provider (the network) is never wanted here. So IP sockets fail softly first.
The inline allowlist (`# pragma: allowlist secret`) is a comment in the code under review: the
code would decide its own verdict, so that filter is off.
"""

import json
import socket
import sys


class _NoNetwork(socket.socket):
    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None and family in (-1, socket.AF_INET, socket.AF_INET6):
            raise OSError("a gate has no network")
        super().__init__(family, type, proto, fileno)


socket.socket = _NoNetwork

from detect_secrets import SecretsCollection  # noqa: E402
from detect_secrets.settings import default_settings, get_settings  # noqa: E402

secrets = SecretsCollection()
with default_settings():
    get_settings().disable_filters("detect_secrets.filters.allowlist.is_line_allowlisted")
    for name in sys.argv[1:]:
        secrets.scan_file(name)
json.dump({"results": secrets.json()}, sys.stdout)
