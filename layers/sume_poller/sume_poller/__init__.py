"""sume_poller: watch paid Sume jobs until terminal, cheaply and exactly once."""
