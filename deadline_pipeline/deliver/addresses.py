"""Internationalised e-mail addresses: re-exported from the leaf module :mod:`deadline_pipeline.addresses`,
which the configuration checks addresses with at load time without importing the delivery stage."""

from deadline_pipeline.addresses import (
    AddressError,
    WireAddress,
    address_problems,
    channel_carries_utf8_local_part,
    wire_address,
)

__all__ = ["AddressError", "WireAddress", "address_problems", "channel_carries_utf8_local_part", "wire_address"]
