"""WISV in one place: the verification rule that lets a mismatch through when a CSI-aware head says
a repair is not worth a round (rule), that head and its file (head), the two ways the edge's hidden
states travel and the choice between them (upload), and how the head is trained from the traces'
critical mismatches (training). The wisv_head and wisv_eval stages (pipeline/wisv_head.py,
pipeline/wisv.py) train, register and evaluate it."""
