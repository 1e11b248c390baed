"""The run key: records on the queue are signed by the fleet that produced them, and verified before use.

Every service of a run holds the run key (setting ``run_key``, distributed like the control token: ``fleetrl
run`` generates one per run, compose and k8s read it from a secret). A producer signs each record's encoded
payload — the canonical msgpack bytes the codec wrote, exactly what travels — with HMAC-SHA256 under the run key,
bound to the stream it is written to; a consumer verifies the signature *before* decoding, so a record written
to Redis by anyone without the key (or copied from another stream or run) is dead-lettered with the reason and
counted, and never decoded, trained on or run.

The signature travels beside the payload in the stream entry (field ``s``), so signing costs one HMAC over bytes
that exist anyway: no second encoding. Dead-letter entries are signed too, over payload, reason and original id
(:func:`dead_letter_bytes`), by the consumer that dead-letters them: the learner acts on dead letters (it
re-issues or gives up a position), so one written by anyone else must not count.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_FIELD = b"s"
_DOMAIN = b"fleetrl-record-v1\x00"


class RecordSigner:
    """HMAC-SHA256 of queue payloads under one run key."""

    def __init__(self, key: str | bytes) -> None:
        raw = key.encode() if isinstance(key, str) else bytes(key)
        if len(raw) < 16:
            raise ValueError("the run key must hold at least 16 bytes (generate one: openssl rand -hex 32)")
        self._key = raw

    def _mac(self, stream: str, payload: bytes | bytearray | memoryview) -> hmac.HMAC:
        mac = hmac.new(self._key, _DOMAIN, hashlib.sha256)
        mac.update(stream.encode())
        mac.update(b"\x00")
        mac.update(payload)
        return mac

    def sign(self, stream: str, payload: bytes | bytearray | memoryview) -> bytes:
        """The signature of ``payload`` written to ``stream`` (32 raw bytes)."""
        return self._mac(stream, payload).digest()

    def problem(self, stream: str, payload: bytes | bytearray | memoryview | None,
                signature: bytes | str | None) -> str | None:
        """Why ``payload`` (read from ``stream``) fails verification, or None when it carries a valid signature."""
        if signature is None or len(signature) == 0:
            return "unsigned: the entry carries no run-key signature (written by something outside this run's fleet?)"
        if payload is None:
            return "the entry has no payload"
        sig = signature.encode() if isinstance(signature, str) else bytes(signature)
        if not hmac.compare_digest(sig, self.sign(stream, payload)):
            return "bad signature: not signed with this run's run_key (another run's key, or a forged entry)"
        return None


def dead_letter_bytes(payload: bytes | bytearray | memoryview | None, reason: str, original_id: str) -> bytes:
    """What a dead-letter entry's signature covers."""
    return b"\x00".join([bytes(payload or b""), reason.encode(), original_id.encode()])


def signer_for(run_key) -> RecordSigner | None:
    """The signer of a ``run_key`` setting (a SecretStr or a str); None when no key is set."""
    if run_key is None:
        return None
    value = run_key.get_secret_value() if hasattr(run_key, "get_secret_value") else str(run_key)
    return RecordSigner(value) if value else None
