"""The developer's own code: counts the keys of .env and the profiles of ~/.aws/credentials."""
import configparser
import os
from pathlib import Path

from dotenv import dotenv_values


def report(project: Path = Path("."), home: Path = Path.home()) -> dict:
    aws = configparser.ConfigParser()
    aws.read(home / ".aws" / "credentials")
    return {"env_keys": len(dotenv_values(project / ".env")), "aws_profiles": len(aws.sections())}


if __name__ == "__main__":
    print(report(), "token set" if os.environ.get("API_TOKEN") else "")
