from services.reward.cli import app

app()
