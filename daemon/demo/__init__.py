"""`rung demo`: the whole system on this machine with a private broker and a simulated PLC
(fixtures, not the serving path).
"""
