"""Who may connect: users with hashed passwords, tokens bound to users, anonymous rules.

One place for every protocol: each adapter hands the credentials its protocol carries to the
``Authenticator`` and maps its verdict onto the protocol's own refusal (docs/security.md).
"""

from vibemq_server.auth.authenticator import ANONYMOUS, Authenticator, Verdict
from vibemq_server.auth.exposure import InsecureDefault, check_exposure, is_loopback_peer
from vibemq_server.auth.users import User, UsersFileError, UserStore

__all__ = [
    "ANONYMOUS",
    "Authenticator",
    "InsecureDefault",
    "User",
    "UserStore",
    "UsersFileError",
    "Verdict",
    "check_exposure",
    "is_loopback_peer",
]
