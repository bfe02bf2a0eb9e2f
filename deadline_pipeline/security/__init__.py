"""Secrets and the network edge: :mod:`.redact` masks credentials in everything the product writes,
:mod:`.outbound` decides which hosts an outbound request may reach."""
