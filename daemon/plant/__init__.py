"""Where plant engineers work: PLCopen XML for ST answers, Sparkplug B edge node.
"""
