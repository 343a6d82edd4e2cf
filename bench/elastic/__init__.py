"""Elastic jobs (Litz, issue 30): what moving partitions between running servers costs."""
