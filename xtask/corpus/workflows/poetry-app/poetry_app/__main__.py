from poetry_app import report

print(report())
