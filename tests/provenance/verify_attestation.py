"""Checks a kavi attestation with the in-toto and DSSE reference libraries, none of kavi's code.

    verify_attestation.py ENVELOPE PUBLIC_KEY_HEX WORKSPACE

The DSSE signature (securesystemslib), the statement (in-toto-attestation's v1 Statement,
parsed strictly from its JSON form and validated), the predicate (parsed strictly as a SLSA
Provenance v1 message: an unknown field or a malformed time is an error), and each subject's
SHA-256 against the file under WORKSPACE. Prints `verified` and exits 0, or prints what failed
and exits 1.
"""
import base64
import hashlib
import json
import sys
from pathlib import Path

from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey

PREDICATE_TYPE = "https://slsa.dev/provenance/v1"


def main():
    envelope_path, public_hex, workspace = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    envelope = Envelope.from_dict(json.loads(Path(envelope_path).read_text()))
    key = SSlibKey(public_hex, "ed25519", "ed25519", {"public": public_hex})
    try:
        envelope.verify([key], 1)
    except Exception as e:  # securesystemslib raises VerificationError
        sys.exit(f"signature: {e}")
    if envelope.payload_type != "application/vnd.in-toto+json":
        sys.exit(f"payload type: {envelope.payload_type}")
    statement_json = json.loads(envelope.payload)
    proto = json_format.ParseDict(statement_json, statement_pb2.Statement())
    Statement.copy_from_pb(proto).validate()
    if proto.predicate_type != PREDICATE_TYPE:
        sys.exit(f"predicate type: {proto.predicate_type}")
    provenance = json_format.ParseDict(statement_json["predicate"], provenance_pb2.Provenance())
    if not provenance.build_definition.build_type or not provenance.run_details.builder.id:
        sys.exit("provenance: no build type or builder id")
    for subject in proto.subject:
        actual = hashlib.sha256((workspace / subject.name).read_bytes()).hexdigest()
        if subject.digest["sha256"] != actual:
            sys.exit(f"subject {subject.name}: attested {subject.digest['sha256']}, is {actual}")
    print("verified")


if __name__ == "__main__":
    main()
