"""HA replication: master side (ha.master) and slave side (ha.slave)."""
