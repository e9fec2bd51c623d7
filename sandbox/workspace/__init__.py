"""The rollout workspace: the agent's tree, its container session, its health, image-held trees and the agent's own repository."""
