"""How the e-mail channels write header fields: :data:`MAIL_POLICY`, ``email.policy.SMTP`` with header
classes that never emit an invalid RFC 2047 encoded word.

Why: the folder of Python's ``email`` package (``email._header_value_parser``, CPython gh-136052)
writes an *empty* encoded word, ``=?utf-8?q??=``, when the room left on a line fits an encoded word's
frame but not the next encoded character. A German title such as ``Meldung an Netzbetreiber:
Routeraustausch und übriggebliebene Glasfaser`` came out as ``... Routeraustausch und =?utf-8?q??=``
with the rest on the next line, and so did many long non-ASCII subjects. RFC 2047 §2 requires
encoded-text of at least one character, and some mail clients show such a subject garbled. The same
folder also drops or adds spaces around encoded words in other subjects, which then do not decode to
the text that was set.

* Unstructured fields (Subject, and any other field without a structure of its own): whenever the
  standard fold needs encoded words, the field is encoded instead by the older
  :class:`email.header.Header` encoder (:func:`encoded_field`): the text from the first word that
  needs encoding to the last becomes encoded words of at most 75 characters (RFC 2047 §2), one per
  line of at most 76, separated by folding white space, each holding whole characters (RFC 2047
  §5); the ASCII words before and after stay text. Decoders drop the white space between adjacent
  encoded words and keep it between an encoded word and text (RFC 2047 §6.2), so the field decodes
  to exactly the text set. Text that needs no
  encoded word (ASCII, or UTF-8 written as is under RFC 6532) keeps the standard fold, or is written
  on one line where that fold would start it on the next (see :class:`_EncodedWordsFold`).
* Address fields (From, To): a display name must stay a phrase beside its address (RFC 2047 §5(3)),
  so the standard fold is kept and only empty encoded words are taken out of it, with the white
  space before them. An empty encoded word contributes no text and the white space after it is
  kept, so the display name reads the same.
"""

from __future__ import annotations

import re
from email.header import Header
from email.headerregistry import HeaderRegistry, UniqueAddressHeader, UniqueUnstructuredHeader, UnstructuredHeader
from email.policy import SMTP

# RFC 2047 §2: an encoded word is at most 75 characters; a folded line holds one after a space.
ENCODED_LINE_CHARS = 76
# RFC 5322 §2.1.1: a line is at most 998 octets besides its CRLF.
LINE_MAX_OCTETS = 998
# An encoded word with no encoded text, and the white space (a fold included) before it.
EMPTY_ENCODED_WORD = re.compile(r"\s*=\?[^?\s]+\?[bq]\?\?=", re.IGNORECASE)


def encoded_field(name: str, value: str, policy) -> str:
    """The field ``name: value`` with RFC 2047 encoded words in UTF-8 from its first word that needs
    one to its last (a word needs one when it is not ASCII or holds ``=?`` / ``?=``), the ASCII words
    before and after left as text, folded at spaces, ending with ``policy.linesep``. Lines are of at
    most :data:`ENCODED_LINE_CHARS` characters (fewer when ``policy.max_line_length`` says so) but
    for an ASCII word longer than that; each encoded word holds at least one whole character.

    ASCII words stay text so that a filter on the plain subject (``[deadline-pipeline]``, a rule
    id) still matches the raw field. When the first word alone cannot follow the field name, the
    whole value is encoded: the folder would otherwise start the value on the next line, read back
    with a leading space. Raises ``UnicodeEncodeError`` for text without a UTF-8 form (a lone
    surrogate)."""
    width = min(ENCODED_LINE_CHARS, policy.max_line_length or ENCODED_LINE_CHARS)
    before, encoded, after = _split_plain_ends(value)
    header = Header(header_name=name)
    if before:
        header.append(before + " ", "us-ascii")
    header.append(encoded, "utf-8")
    if after:
        header.append(" " + after, "us-ascii")
    text = header.encode(linesep=policy.linesep, maxlinelen=width, splitchars=" ")
    if text[:1].isspace():
        text = Header(value, "utf-8", header_name=name).encode(linesep=policy.linesep, maxlinelen=width)
    return f"{name}: {text}{policy.linesep}"


def _split_plain_ends(value: str) -> tuple[str, str, str]:
    """``value`` split at spaces into the ASCII words before the first word that needs encoding, the
    words from there to the last such word, and the ASCII words after it (see :func:`encoded_field`);
    joined with a space each, the parts give ``value`` back. No word needing encoding: all in the
    middle part."""
    words = value.split(" ")
    needs = [i for i, word in enumerate(words) if not word.isascii() or "=?" in word or "?=" in word]
    if not needs:
        return "", value, ""
    first, last = needs[0], needs[-1]
    return " ".join(words[:first]), " ".join(words[first:last + 1]), " ".join(words[last + 1:])


def _octets(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


def _standard_fold_fits(folded: str, name: str, policy) -> bool:
    """Whether the standard fold ``folded`` of field ``name`` can be kept for an unstructured field:
    it holds no encoded word, no line over :data:`LINE_MAX_OCTETS` octets, and does not start the
    value on a continuation line. The folder does that to a value that fits a line of its own but not
    after the field name, and readers (``email`` with ``policy.default`` among them) then read the
    fold's blank as a leading space of the subject."""
    if "=?" in folded or folded.startswith(f"{name}:{policy.linesep}"):
        return False
    return all(_octets(line) <= LINE_MAX_OCTETS for line in folded.split(policy.linesep))


class _EncodedWordsFold:
    """Folding of an unstructured field: the standard fold when it fits
    (:func:`_standard_fold_fits`); else the value unfolded on one line when it needs no encoded word
    (ASCII, or any text under RFC 6532 with ``policy.utf8``) and that line has at most
    :data:`LINE_MAX_OCTETS` octets (RFC 5322 §2.1.1; 78 characters is only recommended); else
    :func:`encoded_field`. A value holding ``=?`` is always encoded, or a reader could decode it."""

    def fold(self, *, policy) -> str:
        # Kept per policy: header_problems folds each field before the message is written, and the
        # encoder takes ~0.2 ms for a long subject (measured), a second time for nothing.
        folds = self.__dict__.setdefault("_folds", {})
        key = (policy.linesep, policy.utf8, policy.max_line_length)
        if key not in folds:
            folds[key] = self._fold(policy)
        return folds[key]

    def _fold(self, policy) -> str:
        value = str(self)
        if not (value.isascii() or policy.utf8):
            return encoded_field(self.name, value, policy)  # the standard fold would need encoded words
        folded = super().fold(policy=policy)
        if _standard_fold_fits(folded, self.name, policy):
            return folded
        line = f"{self.name}: {value}"
        if "=?" not in value and _octets(line) <= LINE_MAX_OCTETS:
            return line + policy.linesep
        return encoded_field(self.name, value, policy)


class SubjectHeader(_EncodedWordsFold, UniqueUnstructuredHeader):
    """The Subject field (at most one per message, RFC 5322 §3.6), folded by :class:`_EncodedWordsFold`."""


class TextHeader(_EncodedWordsFold, UnstructuredHeader):
    """Any field without a structure of its own, folded by :class:`_EncodedWordsFold`."""


class AddressListHeader(UniqueAddressHeader):
    """From and To: the standard fold without empty encoded words (see the module)."""

    def fold(self, *, policy) -> str:
        return EMPTY_ENCODED_WORD.sub("", super().fold(policy=policy))


# Any encoded word (RFC 2047 §2), the encoded-text possibly empty.
_ENCODED_WORD = re.compile(r"=\?[^?\s]*\?[^?\s]*\?([^?\s]*)\?=")


def header_problems(msg) -> list[str]:
    """What is wrong in the header fields of ``msg`` (an :class:`email.message.EmailMessage`) as its
    policy writes them, one text per problem naming the field and the rule: an encoded word with no
    encoded-text or over 75 characters (RFC 2047 §2), an encoded word not separated by white space
    from what stands before or after it (RFC 2047 §5(1)), a line over 998 octets (RFC 5322 §2.1.1).
    Empty list: none. Raises nothing for any text the policy can fold."""
    problems = []
    for name, value in msg.items():
        folded = msg.policy.fold(name, value)
        for word in _ENCODED_WORD.finditer(folded):
            before, after = folded[word.start() - 1:word.start()], folded[word.end():word.end() + 1]
            if not word.group(1) or len(word.group(0)) > 75:
                problems.append(f"{name}: encoded word {word.group(0)[:80]!r} is empty or over 75 characters "
                                "(RFC 2047 §2)")
            elif not before.isspace() or not (after.isspace() or after == ""):
                problems.append(f"{name}: encoded word {word.group(0)!r} is not separated by white space "
                                "(RFC 2047 §5(1))")
        longest = max(_octets(line) for line in folded.split(msg.policy.linesep))
        if longest > LINE_MAX_OCTETS:
            problems.append(f"{name}: a line of {longest} octets (RFC 5322 §2.1.1 allows {LINE_MAX_OCTETS})")
    return problems


def _registry() -> HeaderRegistry:
    registry = HeaderRegistry(default_class=TextHeader)
    registry.map_to_type("subject", SubjectHeader)
    for name in ("from", "to"):
        registry.map_to_type(name, AddressListHeader)
    return registry


#: ``email.policy.SMTP`` (CRLF line ends, lines of at most 78 characters where they can be folded)
#: with the header classes above. ``clone(utf8=True)`` and ``clone(linesep="\n")`` keep them.
MAIL_POLICY = SMTP.clone(header_factory=_registry())
