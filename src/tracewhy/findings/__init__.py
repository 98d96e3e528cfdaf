"""Rules that judge measurements and phrase them as findings with evidence and a next step."""
