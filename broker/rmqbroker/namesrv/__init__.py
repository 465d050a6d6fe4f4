"""Nameserver: route info table and its request handling."""
