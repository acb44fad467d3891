"""HTTP: the RIS API, the admin pages, metrics and health."""
