from services.rollout.cli import app

app()
