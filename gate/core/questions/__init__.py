"""What only questions have: the create and revise bodies (the question spec)
and the answer checks."""
