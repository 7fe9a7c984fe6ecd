"""Evaluation: CSFCube and CL-SciSumm runs and their metrics."""
