from django.apps import AppConfig


class SparkReportsConfig(AppConfig):
    name = "spark_reports"
