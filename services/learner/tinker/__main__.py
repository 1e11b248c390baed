from services.learner.tinker.cli import app

app()
