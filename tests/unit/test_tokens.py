"""Resume tokens: sign/verify laws, key ids and rotation, v1 tokens from before key ids."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.facts import tokens
from processor.facts.keyring import KeyRing
from processor.facts.tokens import TokenClaims

A = ("a", b"key-a-0123456789abcdef")
B = ("b", b"key-b-0123456789abcdef")
TOKEN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.="

claims_st = st.builds(
    TokenClaims,
    run_id=st.text(min_size=1, max_size=40),
    boundary=st.integers(0, 10**9),
    interaction=st.text(min_size=1, max_size=20),
    epoch=st.integers(0, 10**9),
)
key_ids = st.from_regex(r"[A-Za-z0-9_-]{1,32}", fullmatch=True)
secret_st = st.binary(min_size=16, max_size=64)


def _old_v1_token(secret: bytes, claims: TokenClaims) -> str:
    """A token exactly as the processor issued it before keys had ids (format v1)."""

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    fields = (b64(claims.run_id.encode()), str(claims.boundary))
    fields += (b64(claims.interaction.encode()), str(claims.epoch))
    body = ".".join(("v1", *fields))
    return f"{body}.{b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())}"


@given(claims_st, key_ids, secret_st)
def test_a_signed_token_verifies_to_its_claims_and_names_its_key(
    claims: TokenClaims, kid: str, secret: bytes
) -> None:
    ring = KeyRing.single(secret, kid)
    token = tokens.sign(ring, claims)
    assert tokens.verify(ring, token) == claims
    assert tokens.parse(token) == claims
    assert tokens.key_id(token) == kid


@given(claims_st)
def test_the_first_key_signs_and_every_key_verifies(claims: TokenClaims) -> None:
    by_a = tokens.sign(KeyRing((A,)), claims)
    rotated = KeyRing((B, A))
    assert tokens.verify(rotated, by_a) == claims  # old key still listed: verifies
    by_rotated = tokens.sign(rotated, claims)
    assert tokens.key_id(by_rotated) == "b"
    assert tokens.verify(KeyRing((B,)), by_rotated) == claims


@given(claims_st)
def test_a_token_of_a_removed_key_is_refused(claims: TokenClaims) -> None:
    by_a = tokens.sign(KeyRing((A,)), claims)
    assert tokens.verify(KeyRing((B,)), by_a) is None


@given(claims_st, secret_st)
def test_a_token_is_verified_only_with_the_key_it_names(claims: TokenClaims, other: bytes) -> None:
    """The same key id with another secret (a key replaced in place) refuses the token."""
    by_a = tokens.sign(KeyRing((A,)), claims)
    if other != A[1]:
        assert tokens.verify(KeyRing((B, ("a", other))), by_a) is None
    # Under another id, A's secret does not verify a token that names "a" either.
    assert tokens.verify(KeyRing((("c", A[1]),)), by_a) is None


@given(claims_st, st.data())
def test_any_altered_token_is_refused(claims: TokenClaims, data: st.DataObject) -> None:
    ring = KeyRing((B, A))
    token = tokens.sign(ring, claims)
    index = data.draw(st.integers(0, len(token) - 1))
    replacement = data.draw(st.sampled_from(TOKEN_CHARS))
    altered = token[:index] + replacement + token[index + 1 :]
    if altered != token:
        assert tokens.verify(ring, altered) is None


@given(claims_st, st.sampled_from(["run_id", "boundary", "interaction", "epoch"]), st.data())
def test_a_token_whose_claims_were_changed_is_refused(
    claims: TokenClaims, field: str, data: st.DataObject
) -> None:
    """Re-encode one claim field with another value, keeping the MAC: refused."""
    ring = KeyRing((A,))
    token = tokens.sign(ring, claims)
    changed = {
        "run_id": TokenClaims(
            claims.run_id + "x", claims.boundary, claims.interaction, claims.epoch
        ),
        "boundary": TokenClaims(
            claims.run_id, claims.boundary + 1, claims.interaction, claims.epoch
        ),
        "interaction": TokenClaims(claims.run_id, claims.boundary, "x" + claims.interaction, 0),
        "epoch": TokenClaims(claims.run_id, claims.boundary, claims.interaction, claims.epoch + 1),
    }[field]
    spliced = tokens.sign(ring, changed).rpartition(".")[0] + "." + token.rpartition(".")[2]
    assert tokens.parse(spliced) == changed
    assert tokens.verify(ring, spliced) is None


@given(claims_st, key_ids)
def test_a_v1_token_keeps_verifying_while_its_key_is_configured(
    claims: TokenClaims, kid: str
) -> None:
    """Tokens issued before key ids (waiting runs at upgrade) verify with their key,
    whatever id it is listed under now, and are refused once it is removed."""
    old = _old_v1_token(A[1], claims)
    assert tokens.parse(old) == claims
    assert tokens.key_id(old) is None
    assert tokens.verify(KeyRing.single(A[1]), old) == claims
    assert tokens.verify(KeyRing(((kid, A[1]),)), old) == claims
    if kid != "b":
        assert tokens.verify(KeyRing((B, (kid, A[1]))), old) == claims
    assert tokens.verify(KeyRing((B,)), old) is None


@pytest.mark.parametrize(
    "text", ["", "v3.a.b.1.c.2.m", "v2.a.cnVu.x.aQ.1.m", "v1.cnVu.1.aQ.1", "not a token"]
)
def test_what_is_not_a_token_parses_and_verifies_to_nothing(text: str) -> None:
    assert tokens.parse(text) is None
    assert tokens.verify(KeyRing((A,)), text) is None


@given(claims_st)
def test_the_digest_is_of_the_whole_token(claims: TokenClaims) -> None:
    """Only the digest is stored: a token re-signed with another key is another token."""
    assert tokens.digest(tokens.sign(KeyRing((A,)), claims)) != tokens.digest(
        tokens.sign(KeyRing((B,)), claims)
    )


def test_a_key_ring_refuses_bad_ids_and_never_shows_its_secrets() -> None:
    with pytest.raises(ValueError, match="at least one key"):
        KeyRing(())
    with pytest.raises(ValueError, match="key id"):
        KeyRing((("has.dot", b"s"),))
    with pytest.raises(ValueError, match="unique"):
        KeyRing((A, ("a", b"other")))
    ring = KeyRing((B, A))
    assert ring.signing == B and ring.get("a") == A[1] and ring.get("gone") is None
    assert A[1].decode() not in repr(ring) and repr(ring) == "KeyRing(ids=['b', 'a'])"


# --- redaction ------------------------------------------------------------------------------

text_around = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)


@given(claims_st, key_ids, secret_st, text_around, text_around)
def test_a_redacted_token_keeps_its_claims_and_no_longer_verifies(
    claims: TokenClaims, kid: str, secret: bytes, before: str, after: str
) -> None:
    ring = KeyRing.single(secret, kid)
    token = tokens.sign(ring, claims)
    shown = tokens.redact(f"{before} {token} {after}")
    mac = token.rpartition(".")[2]
    assert mac not in shown
    redacted = token.rpartition(".")[0] + "." + "*" * len(mac)
    assert shown == f"{tokens.redact(before)} {redacted} {tokens.redact(after)}"
    assert tokens.parse(redacted) is None or tokens.verify(ring, redacted) is None


@given(claims_st, secret_st, st.binary(max_size=30), st.binary(max_size=30))
def test_redacted_bytes_keep_their_length_and_lose_every_mac(
    claims: TokenClaims, secret: bytes, before: bytes, after: bytes
) -> None:
    v2 = tokens.sign(KeyRing.single(secret, "k"), claims).encode()
    v1 = _old_v1_token(secret, claims).encode()
    raw = before + v2 + b"\x00" + v1 + after
    shown = tokens.redact_bytes(raw)
    assert len(shown) == len(raw)
    assert v2.rpartition(b".")[2] not in shown and v1.rpartition(b".")[2] not in shown
    assert tokens.redact(v2.decode()).encode() in shown


@given(st.text(alphabet=TOKEN_CHARS, max_size=200))
def test_redaction_leaves_what_is_no_token_alone(text: str) -> None:
    if tokens.redact(text) != text:  # only a token's shape is touched: "v1." or "v2." ...
        assert "v1." in text or "v2." in text
    assert tokens.redact("order o-1: pay 12 EUR by v2") == "order o-1: pay 12 EUR by v2"
