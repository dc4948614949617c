"""Scores as the field reports them: sacreBLEU and chrF for translation; accuracy, F1, MCC, correlations and
entity F1 for fine-tuning.
"""
