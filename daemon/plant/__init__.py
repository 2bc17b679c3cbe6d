"""Where plant engineers work: ST answers as PLCopen XML, in the edition the PLC takes."""
