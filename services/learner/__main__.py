from services.learner.cli import app

app()
