"""The mechanisms an analyst calls from SQL or Python: sparse vector, workloads, PMW, fit."""
