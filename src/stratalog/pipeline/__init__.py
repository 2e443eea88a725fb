"""Data pipelines that run on Stratalog and Spark."""
