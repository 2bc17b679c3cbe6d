"""The ``st`` kind of task (``kind.py``): IEC 61131-3 Structured Text POUs, rendered and
parsed (``pou``), read from the request (``request``), shaped while written (``shape``,
``grammar``), run on a simulated clock (``interpreter``) and written for an edition
(``edition``).
"""
