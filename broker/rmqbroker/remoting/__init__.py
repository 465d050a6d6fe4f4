"""Remoting: frames, codes, Java wire names, asyncio server and client."""
